package openai

import "testing"

// TestEngineError: an engine's error answer keeps its message, type and
// param (vLLM's current and older forms), prefixed with who answered;
// any other body is the message.
func TestEngineError(t *testing.T) {
	for _, tc := range []struct {
		body            string
		msg, typ, param string
	}{
		{`{"error":{"message":"too long","type":"BadRequestError","param":"prompt","code":400}}`, "p: too long", "BadRequestError", "prompt"},
		{`{"object":"error","message":"too long","type":"BadRequestError","param":null,"code":400}`, "p: too long", "BadRequestError", ""},
		{`not json`, "p: not json", "", ""},
		{`{"detail":"x"}`, `p: {"detail":"x"}`, "", ""},
	} {
		e := EngineError(400, "p: ", []byte(tc.body))
		if e.Status != 400 || e.Message != tc.msg || e.Type != tc.typ || e.Param != tc.param {
			t.Errorf("%s: %+v", tc.body, e)
		}
	}
}
