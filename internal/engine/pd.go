package engine

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"
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
type kvTransferResponse struct {
	DoRemotePrefill bool    `json:"do_remote_prefill"`
	DoRemoteDecode  bool    `json:"do_remote_decode"`
	RemoteEngineID  string  `json:"remote_engine_id"`
	RemoteBlockIDs  []int32 `json:"remote_block_ids"`
	RemoteHost      string  `json:"remote_host"`
	RemotePort      int     `json:"remote_port"`
	RemoteRequestID string  `json:"remote_request_id"`
	TPSize          int     `json:"tp_size"`
}

// remotePrefill is a validated leg-2 request's origin.
type remotePrefill struct {
	engineID  string
	host      string
	port      int
	blockIDs  []int
	requestID string
}

// kvMode is what kv_transfer_params ask of this engine.
type kvMode int

const (
	kvNone kvMode = iota
	kvRemoteDecode
	kvRemotePrefill
)

// parseKVTransferParams validates kv_transfer_params. raw may be empty or
// null (no disaggregation).
func parseKVTransferParams(raw json.RawMessage) (kvMode, *remotePrefill, error) {
	if len(bytes.TrimSpace(raw)) == 0 || string(bytes.TrimSpace(raw)) == "null" {
		return kvNone, nil, nil
	}
	var m map[string]any
	if err := json.Unmarshal(raw, &m); err != nil || m == nil {
		return kvNone, nil, errors.New("kv_transfer_params must be a JSON object")
	}
	flag := func(k string) (bool, error) {
		v, ok := m[k]
		if !ok || v == nil {
			return false, nil
		}
		b, ok := v.(bool)
		if !ok {
			return false, fmt.Errorf("kv_transfer_params.%s must be a boolean", k)
		}
		return b, nil
	}
	decode, err := flag("do_remote_decode")
	if err != nil {
		return kvNone, nil, err
	}
	prefill, err := flag("do_remote_prefill")
	if err != nil {
		return kvNone, nil, err
	}
	switch {
	case decode && prefill:
		return kvNone, nil, errors.New("kv_transfer_params: do_remote_decode and do_remote_prefill cannot both be true")
	case decode:
		return kvRemoteDecode, nil, nil
	case !prefill:
		return kvNone, nil, nil
	}
	rp := &remotePrefill{}
	var missing, bad []string
	str := func(k string, dst *string) {
		v, ok := m[k]
		if !ok || v == nil {
			missing = append(missing, k)
			return
		}
		s, ok := v.(string)
		if !ok || s == "" {
			bad = append(bad, k+" (want a non-empty string)")
			return
		}
		*dst = s
	}
	str("remote_engine_id", &rp.engineID)
	str("remote_host", &rp.host)
	switch v := m["remote_port"].(type) {
	case nil:
		missing = append(missing, "remote_port")
	case float64:
		if v != float64(int(v)) || v <= 0 || v > 65535 {
			bad = append(bad, "remote_port (want a port number)")
		}
		rp.port = int(v)
	default:
		bad = append(bad, "remote_port (want a port number)")
	}
	switch v := m["remote_block_ids"].(type) {
	case nil:
		missing = append(missing, "remote_block_ids")
	case []any:
		for _, x := range v {
			f, ok := x.(float64)
			if !ok || f != float64(int(f)) || f < 0 {
				bad = append(bad, "remote_block_ids (want a list of block ids)")
				break
			}
			rp.blockIDs = append(rp.blockIDs, int(f))
		}
	default:
		bad = append(bad, "remote_block_ids (want a list of block ids)")
	}
	if id, ok := m["remote_request_id"].(string); ok {
		rp.requestID = id
	}
	if len(missing)+len(bad) > 0 {
		var parts []string
		if len(missing) > 0 {
			parts = append(parts, "missing "+strings.Join(missing, ", "))
		}
		if len(bad) > 0 {
			parts = append(parts, "malformed "+strings.Join(bad, ", "))
		}
		return kvNone, nil, fmt.Errorf("kv_transfer_params with do_remote_prefill=true: %s", strings.Join(parts, "; "))
	}
	return kvRemotePrefill, rp, nil
}

// holdResponse builds the leg-1 answer for a request whose blocks are held.
func (e *Engine) holdResponse(r *request) *kvTransferResponse {
	host, port := e.hostPort()
	return &kvTransferResponse{
		DoRemotePrefill: true,
		DoRemoteDecode:  false,
		RemoteEngineID:  e.cfg.EngineID,
		RemoteBlockIDs:  append([]int32(nil), r.blocks...),
		RemoteHost:      host,
		RemotePort:      port,
		RemoteRequestID: r.id,
		TPSize:          1,
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
	if err := json.NewDecoder(r.Body).Decode(&body); err != nil || body.RequestID == "" {
		writeError(w, http.StatusBadRequest, "body must be {\"request_id\": ...}")
		return
	}
	if body.EngineID != "" && body.EngineID != e.cfg.EngineID {
		writeError(w, http.StatusBadRequest, fmt.Sprintf("engine_id %q is not this engine (%q)", body.EngineID, e.cfg.EngineID))
		return
	}
	var released bool
	if err := e.sched.do(r.Context(), func() { released = e.sched.releaseHold(body.RequestID) }); err != nil {
		writeError(w, http.StatusServiceUnavailable, "engine is not running")
		return
	}
	writeJSON(w, http.StatusOK, map[string]bool{"released": released})
}
