package engine

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"net/http"
	"strconv"
	"time"

	"github.com/kvgate/kvgate/internal/openai"
)

// Prefill/decode disaggregation with vLLM's NixlConnector protocol.
//
// Leg 1: a prefill-capable engine receives kv_transfer_params
// {do_remote_decode: true, ...}; it computes the prefill (max_tokens is
// forced to 1), keeps the request's blocks referenced and answers with
// top-level kv_transfer_params {do_remote_prefill: true, remote_engine_id,
// remote_block_ids, remote_host, remote_port, remote_request_id, tp_size}.
//
// Leg 2: a decode-capable engine receives those params; it allocates blocks
// for the prompt, waits the modelled KV transfer time of the prompt tokens
// it does not already hold in its own prefix cache, computes the last prompt
// token as a decode step and decodes. When the transfer is done it tells the
// prefill engine to drop its hold (POST /internal/kv/release on
// remote_host:remote_port, the emulator's stand-in for NIXL's notification);
// otherwise the hold expires after KVHoldTimeout.

// kvTransferResponse is what a prefill engine returns for remote decode.
// (openai.KVTransferAnswer).
type kvTransferResponse = openai.KVTransferAnswer

// remotePrefill is a validated leg-2 request's origin.
type remotePrefill struct {
	engineID  string
	host      string
	port      int
	blockIDs  []int
	requestID string
}

// holdResponse builds the leg-1 answer for a request whose blocks are held.
func (e *Engine) holdResponse(r *request) *kvTransferResponse {
	host, port := e.hostPort()
	ids := make([]int, len(r.blocks))
	for i, b := range r.blocks {
		ids[i] = int(b)
	}
	return &kvTransferResponse{
		DoRemotePrefill: true,
		DoRemoteDecode:  false,
		RemoteEngineID:  e.cfg.EngineID,
		RemoteBlockIDs:  [][]int{ids},
		RemoteHost:      host,
		RemotePort:      port,
		RemoteRequestID: r.id,
		TPSize:          1,
		RemoteNumTokens: r.promptLen,
	}
}

func (e *Engine) hostPort() (string, int) {
	e.mu.Lock()
	addr := e.addr
	e.mu.Unlock()
	host, ps, err := net.SplitHostPort(addr)
	if err != nil {
		return e.cfg.Host, e.cfg.Port
	}
	port, _ := strconv.Atoi(ps)
	return host, port
}

// transferDone tells the prefill engine that its blocks were pulled. Best
// effort: the hold expires anyway.
func (e *Engine) transferDone(r *request) {
	rp := r.remotePrefill
	if rp == nil || rp.requestID == "" {
		return
	}
	go func() {
		ctx, cancel := context.WithTimeout(e.ctx, 5*time.Second)
		defer cancel()
		body, _ := json.Marshal(map[string]string{"request_id": rp.requestID, "engine_id": rp.engineID})
		url := "http://" + net.JoinHostPort(rp.host, strconv.Itoa(rp.port)) + "/internal/kv/release"
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
		if err != nil {
			return
		}
		req.Header.Set("Content-Type", "application/json")
		resp, err := e.client.Do(req)
		if err != nil {
			e.log.Debug("kv release notification failed", "url", url, "err", err)
			return
		}
		resp.Body.Close()
	}()
}

func (e *Engine) handleRelease(w http.ResponseWriter, r *http.Request) {
	var body struct {
		RequestID string `json:"request_id"`
		EngineID  string `json:"engine_id"`
	}
	if err := e.decodeObject(w, r, &body); err != nil {
		openai.WriteError(w, err)
		return
	}
	if body.RequestID == "" {
		openai.WriteError(w, openai.BadRequest(`body must be {"request_id": ...}`).WithParam("request_id"))
		return
	}
	if body.EngineID != "" && body.EngineID != e.cfg.EngineID {
		openai.WriteError(w, openai.BadRequest("engine_id %q is not this engine (%q)", body.EngineID, e.cfg.EngineID).WithParam("engine_id"))
		return
	}
	var released bool
	if err := e.sched.do(r.Context(), func() { released = e.sched.releaseHold(body.RequestID) }); err != nil {
		openai.WriteError(w, openai.Unavailable(time.Second, "engine is not running"))
		return
	}
	openai.WriteJSON(w, http.StatusOK, map[string]bool{"released": released})
}
