package openai

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// ErrorBody is the error response of the OpenAI API as vLLM sends it:
//
//	{"error": {"message": "...", "type": "BadRequestError", "param": null, "code": 400}}
type ErrorBody struct {
	Error ErrorInfo `json:"error"`
}

// ErrorInfo is the inside of ErrorBody.
type ErrorInfo struct {
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    int     `json:"code"`
}

// Error is an error with its HTTP status, written as an ErrorBody.
type Error struct {
	Status  int
	Type    string // "" means TypeOf(Status)
	Message string
	Param   string // the request field at fault, or ""
	// RetryAfter, when > 0, is sent as a Retry-After header (whole
	// seconds, rounded up): 429 and 503 answers.
	RetryAfter time.Duration
	// NoRetry sends X-Should-Retry: false, which the OpenAI SDKs obey
	// over their own retry of a 429 or 5xx: an answer whose client should
	// hear it now rather than have it retried for it.
	NoRetry bool
}

func (e *Error) Error() string { return e.Message }

// EngineError reads an engine's error answer with the given status: an
// OpenAI error body ({"error":{"message","type","param"}}, or vLLM's older
// {"object":"error","message",...}) keeps its message, type and param, the
// message prefixed with who answered (prefix); any other body is the
// message as it came.
func EngineError(status int, prefix string, body []byte) *Error {
	type fields struct {
		Message string `json:"message"`
		Type    string `json:"type"`
		Param   any    `json:"param"`
	}
	var doc struct {
		Error *fields `json:"error"`
		fields
	}
	e := &Error{Status: status, Message: prefix + strings.TrimSpace(string(body))}
	if json.Unmarshal(body, &doc) != nil {
		return e
	}
	f := doc.Error
	if f == nil {
		f = &doc.fields
	}
	if f.Message == "" {
		return e
	}
	e.Message, e.Type = prefix+f.Message, f.Type
	if p, ok := f.Param.(string); ok {
		e.Param = p
	}
	return e
}

// WithParam sets the field at fault and returns e.
func (e *Error) WithParam(p string) *Error {
	e.Param = p
	return e
}

// Errorf is an Error with the given status.
func Errorf(status int, format string, args ...any) *Error {
	return &Error{Status: status, Message: fmt.Sprintf(format, args...)}
}

// BadRequest is a 400.
func BadRequest(format string, args ...any) *Error {
	return Errorf(http.StatusBadRequest, format, args...)
}

// NotFound is a 404.
func NotFound(format string, args ...any) *Error {
	return Errorf(http.StatusNotFound, format, args...)
}

// TooLarge is the 413 for a body above limit bytes.
func TooLarge(limit int64) *Error {
	return Errorf(http.StatusRequestEntityTooLarge, "request body is larger than the limit of %d bytes", limit)
}

// TooManyRequests is a 429 asking the client to retry after retry.
func TooManyRequests(retry time.Duration, format string, args ...any) *Error {
	e := Errorf(http.StatusTooManyRequests, format, args...)
	e.RetryAfter = retry
	return e
}

// Unavailable is a 503, with a Retry-After when retry > 0.
func Unavailable(retry time.Duration, format string, args ...any) *Error {
	e := Errorf(http.StatusServiceUnavailable, format, args...)
	e.RetryAfter = retry
	return e
}

// Internal is a 500.
func Internal(format string, args ...any) *Error {
	return Errorf(http.StatusInternalServerError, format, args...)
}

// TypeOf is the error type name sent for status, following the names of
// the OpenAI client libraries (BadRequestError, NotFoundError, ...).
func TypeOf(status int) string {
	switch status {
	case http.StatusBadRequest:
		return "BadRequestError"
	case http.StatusUnauthorized:
		return "AuthenticationError"
	case http.StatusForbidden:
		return "PermissionDeniedError"
	case http.StatusNotFound:
		return "NotFoundError"
	case http.StatusMethodNotAllowed:
		return "MethodNotAllowedError"
	case http.StatusConflict:
		return "ConflictError"
	case http.StatusRequestEntityTooLarge:
		return "RequestTooLargeError"
	case http.StatusUnprocessableEntity:
		return "UnprocessableEntityError"
	case http.StatusTooManyRequests:
		return "RateLimitError"
	case http.StatusBadGateway:
		return "BadGatewayError"
	case http.StatusServiceUnavailable:
		return "ServiceUnavailableError"
	case http.StatusGatewayTimeout:
		return "GatewayTimeoutError"
	}
	if status >= 500 {
		return "InternalServerError"
	}
	return "BadRequestError"
}

// AsError maps err to an *Error: an *Error as it is, an
// *http.MaxBytesError to a 413, a cancelled or expired context to a 504 and
// anything else to a 500.
func AsError(err error) *Error {
	var e *Error
	var mb *http.MaxBytesError
	switch {
	case errors.As(err, &e):
		return e
	case errors.As(err, &mb):
		return TooLarge(mb.Limit)
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return Errorf(http.StatusGatewayTimeout, "%v", err)
	}
	return Internal("%v", err)
}

// WriteError writes err (see AsError) as an ErrorBody with its status
// (a MessagesErrorBody to a MessagesErrors writer) and, for an Error with
// RetryAfter, a Retry-After header.
func WriteError(w http.ResponseWriter, err error) {
	e := AsError(err)
	if e.RetryAfter > 0 {
		secs := int64((e.RetryAfter + time.Second - 1) / time.Second)
		w.Header().Set("Retry-After", strconv.FormatInt(secs, 10))
	}
	if e.NoRetry {
		w.Header().Set("X-Should-Retry", "false")
	}
	if messagesForm(w) {
		WriteJSON(w, e.Status, MessagesErrorBody{Type: "error", Error: MessagesErrorInfo{Type: MessagesErrorType(e.Status), Message: e.Message}})
		return
	}
	typ := e.Type
	if typ == "" {
		typ = TypeOf(e.Status)
	}
	body := ErrorBody{Error: ErrorInfo{Message: e.Message, Type: typ, Code: e.Status}}
	if e.Param != "" {
		p := e.Param
		body.Error.Param = &p
	}
	WriteJSON(w, e.Status, body)
}

// WriteJSON writes v as a JSON response with status.
func WriteJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		status = http.StatusInternalServerError
		b, _ = json.Marshal(ErrorBody{Error: ErrorInfo{Message: "cannot encode the response: " + err.Error(), Type: TypeOf(status), Code: status}})
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(append(b, '\n'))
}
