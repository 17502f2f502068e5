package gateway

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"net/http"
	"net/url"
	"strings"

	"github.com/kvgate/kvgate/internal/fleet"
	"github.com/kvgate/kvgate/internal/load"
)

// proxySGLang runs SGLang's P/D protocol for a request prefilled on an
// endpoint with a bootstrap port (fleet.Endpoint.BootstrapPort), as
// SGLang's router does: one body, naming the prefill engine's bootstrap
// server and a fresh room, goes to the prefill and the decode engine at
// once, and the decode engine's answer is the client's. The prefill leg's
// answer is read and dropped; it comes when its prefill ends, an observed
// prefill unless the decode's first byte came first.
//
// A prefill leg that fails cancels the decode leg, which would otherwise
// wait for KV that never comes, and the client hears the prefill's failure;
// a decode leg that fails before answering cancels the prefill leg. It
// returns the endpoint to retry without (as proxy does) and the error.
func (g *Gateway) proxySGLang(ctx context.Context, w http.ResponseWriter, r *http.Request, rt *routed, p *plan, fl *load.Flight, got *reached) (string, error) {
	lf := p.mf.load
	body := bootstrapBody(rt, p.prefill.ep)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	prefilled := make(chan error, 1)
	go func() {
		err := g.sglangPrefillLeg(ctx, r, rt, p.prefill, body)
		if err == nil {
			lf.FirstToken(fl, g.clock())
		} else {
			cancel()
		}
		prefilled <- err
	}()
	resp, err := g.send(ctx, r, p.decode, rt, body)
	if err != nil {
		cancel()
		if perr := <-prefilled; perr != nil && !errors.Is(perr, context.Canceled) {
			return p.prefill.ep.Name, perr // the prefill failed first
		}
		return p.decode.ep.Name, err
	}
	defer resp.Body.Close()
	refused := resp.StatusCode >= 400
	tpot, err := g.relay(w, resp, rt, p.decode, g.feedback(rt, lf, fl, got, refused))
	// Served (or refused) by the decode engine: the prefill leg's answer,
	// if it has not come, is no longer needed.
	cancel()
	perr := <-prefilled
	var ue *upstreamError
	switch {
	case err != nil && perr != nil && !errors.Is(perr, context.Canceled):
		if errors.As(err, &ue) { // nothing written: the prefill failed first
			return p.prefill.ep.Name, perr
		}
		return "", fmt.Errorf("%w (the prefill leg failed: %v)", err, perr)
	case errors.As(err, &ue): // the decode engine failed before its first byte
		return p.decode.ep.Name, err
	case err != nil:
		return "", err
	case refused:
		return "", &engineRefused{endpoint: p.decode.ep.Name, status: resp.StatusCode}
	}
	if tpot > 0 {
		lf.Finished(fl, g.clock(), tpot)
	}
	return "", nil
}

// sglangPrefillLeg sends SGLang's prefill leg and reads its answer to the
// end (prefillAnswer), which tells nothing more.
func (g *Gateway) sglangPrefillLeg(ctx context.Context, r *http.Request, rt *routed, m *member, body []byte) error {
	_, err := g.prefillAnswer(ctx, r, rt, m, body)
	return err
}

// bootstrapRoom is a random 63-bit bootstrap room for a request prefilled
// on ep. SGLang finds a prefill's data-parallel rank from the room (room
// mod the prefill's ranks, on the decode side as in the prefill engine's
// own dispatch), so for an endpoint that stands for one rank the room is
// drawn among those that name it.
func bootstrapRoom(r uint64, ep fleet.Endpoint) uint64 {
	r &= math.MaxInt64
	if !ep.Ranked() {
		return r
	}
	n := uint64(ep.DPSize)
	r = r - r%n + uint64(ep.DPRank)
	if r > math.MaxInt64 {
		r -= n
	}
	return r
}

// bootstrapBody is the body of both legs of SGLang's P/D protocol for rt
// on prefill endpoint ep: scalar bootstrap fields, or for a batch
// (rt.batch) lists of them, a room each, as SGLang's router sends them.
func bootstrapBody(rt *routed, ep fleet.Endpoint) []byte {
	host := hostOf(ep.URL)
	if rt.batch == 0 {
		return rt.req.BootstrapBody(host, ep.BootstrapPort, bootstrapRoom(rand.Uint64(), ep))
	}
	rooms := make([]uint64, rt.batch)
	for i := range rooms {
		rooms[i] = bootstrapRoom(rand.Uint64(), ep)
	}
	return rt.req.BootstrapBatchBody(host, ep.BootstrapPort, rooms)
}

// hostOf is a URL's host without its port (SGLang's bootstrap_host); an
// IPv6 address keeps its brackets, since SGLang's decode engine joins it
// to the port as host:port (SGLang's routers bracket it too).
func hostOf(u string) string {
	p, err := url.Parse(u)
	if err != nil {
		return ""
	}
	h := p.Hostname()
	if strings.Contains(h, ":") {
		return "[" + h + "]"
	}
	return h
}
