package openai

import "bytes"

// AnswerUsage reads an answer's body as it passes, in reads of any size,
// for its completion tokens: the last "completion_tokens" member's count
// (OpenAI's usage object; SGLang's /generate meta_info, in each of its
// streamed events too).
// A key written with a backslash in it, as inside a JSON string (a model
// writing JSON about usage), is not one.
type AnswerUsage struct {
	// key is the member counted, quoted ("": completionKey).
	key   string
	win   []byte // the last bytes of the previous reads, then this read's
	n     int
	found bool
}

const completionKey = `"completion_tokens"`

// OutputTokensUsage reads a Responses or Messages API answer for its
// output tokens (usage.output_tokens; in a stream, its response.completed
// or message_delta event's).
func OutputTokensUsage() *AnswerUsage { return &AnswerUsage{key: `"output_tokens"`} }

// CachedTokensUsage reads an answer for the prompt tokens its engine
// found cached (usage.prompt_tokens_details.cached_tokens, or a Responses
// answer's input_tokens_details.cached_tokens; the last one a stream
// sends). vLLM reports it with --enable-prompt-tokens-details.
func CachedTokensUsage() *AnswerUsage { return &AnswerUsage{key: `"cached_tokens"`} }

// PromptTokensUsage reads a chat or completion answer for its prompt
// tokens (usage.prompt_tokens): whether it had a usage at all.
func PromptTokensUsage() *AnswerUsage { return &AnswerUsage{key: `"prompt_tokens"`} }

// answerCarry is the bytes kept between reads: a key, spaces and a
// count split between two reads are whole in the next window.
const answerCarry = 64

// Scan reads the next bytes of the body.
func (u *AnswerUsage) Scan(p []byte) {
	u.win = append(u.win, p...)
	u.find(false)
	if len(u.win) > answerCarry {
		u.win = append(u.win[:0], u.win[len(u.win)-answerCarry:]...)
	}
}

// Last is the last completion tokens the reads so far brought whole
// (false: none yet): a stream whose events count their tokens (SGLang's
// /generate).
func (u *AnswerUsage) Last() (int, bool) { return u.n, u.found }

// Count is the body's completion tokens once it ended (false: none
// found).
func (u *AnswerUsage) Count() (int, bool) {
	u.find(true)
	return u.n, u.found
}

// find takes every count in the window whose digits end before it does
// (or at it, at the body's end): one that runs to the window's end may
// go on in the next read, which sees it whole.
func (u *AnswerUsage) find(atEnd bool) {
	w, key := u.win, u.key
	if key == "" {
		key = completionKey
	}
	for i := 0; ; {
		k := bytes.Index(w[i:], []byte(key))
		if k < 0 {
			return
		}
		j := skipSpace(w, i+k+len(key))
		i += k + len(key)
		if j >= len(w) || w[j] != ':' {
			continue
		}
		j = skipSpace(w, j+1)
		d := j
		n := 0
		for d < len(w) && w[d] >= '0' && w[d] <= '9' && d-j < 10 {
			n = n*10 + int(w[d]-'0')
			d++
		}
		if d == j || (d == len(w) && !atEnd) || (d < len(w) && w[d] >= '0' && w[d] <= '9') {
			continue // no digits, perhaps more to come, or too many
		}
		u.n, u.found = n, true
	}
}
