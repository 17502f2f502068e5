package gateway

// Outcomes: the outcome label of kvgate_requests_total, one per request
// (docs/serve.md has the table).
const (
	outcomeOK             = "ok"
	outcomeRejected       = "rejected"
	outcomeYielded        = "yielded"
	outcomeDisplaced      = "displaced"
	outcomeBadRequest     = "bad_request"
	outcomeTokenizerError = "tokenizer_error"
	outcomeOverloaded     = "overloaded"
	outcomeUnavailable    = "unavailable"
	outcomeHoldFull       = "hold_full"
	outcomeEngineRefused  = "engine_refused"
	outcomeUpstreamError  = "upstream_error"
	outcomeBrokenStream   = "broken_stream"
	outcomeClientGone     = "client_gone"
	outcomeInternalError  = "internal_error"
)

// allOutcomes lists the outcomes, for the series exported from the start.
var allOutcomes = []string{outcomeOK, outcomeRejected, outcomeYielded, outcomeDisplaced, outcomeBadRequest, outcomeTokenizerError, outcomeOverloaded,
	outcomeUnavailable, outcomeHoldFull, outcomeEngineRefused, outcomeUpstreamError, outcomeBrokenStream, outcomeClientGone, outcomeInternalError}
