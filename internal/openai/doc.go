// Package openai holds the OpenAI API types kvgate reads and writes on the
// wire, shared by the engine emulator, the kvindex admin API and the
// gateway: the error body and its writer (Error, WriteError), completion and
// chat requests parsed into the fields kvgate acts on while keeping the body
// as received for proxying (Request, ParseCompletion, ParseChat, Rewrite),
// the non-streamed responses, and vLLM's NixlConnector kv_transfer_params
// with the rewrites of the two-leg prefill/decode flow.
//
// # Parsing
//
// A body is one JSON object and nothing else: trailing bytes, a second
// value, a top-level key given twice and a wrong type for a field kvgate
// reads are 400s naming the field. Top-level keys are matched exactly, as
// vLLM matches them, so a proxy and the engine behind it cannot read
// different values out of one body. Numbers are kept as sent (int64);
// their ranges are checked by whoever knows the limits, without adding
// client numbers together (see the engine's length checks).
//
// # Prefill/decode and kv_transfer_params
//
// Leg 2 of the NixlConnector flow makes the decode engine connect to the
// remote_host:remote_port named in kv_transfer_params (to pull KV, and in
// kvgate's emulator to POST /internal/kv/release there). That is the
// protocol, but it means kv_transfer_params are a capability: a gateway must
// never forward the ones a client sent. It strips them
// (Request.StripRoutingParams) from every request it proxies as is,
// and for a disaggregated request builds its own: PrefillBody for leg 1
// (do_remote_decode) and, from its prefill engine's answer
// (ResponseKVTransferParams), DecodeBody for leg 2. SGLang's P/D protocol
// has the same capability in bootstrap_host and bootstrap_port, stripped
// likewise; BootstrapBody builds both of its legs.
package openai
