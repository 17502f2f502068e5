package kvpub

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvgate/kvgate/internal/zmtp"
)

// collector exports a Publisher's socket counters.
type collector struct {
	p                                    *Publisher
	peers, sent, dropped, closed, replay *prometheus.Desc
}

// Collector returns a Prometheus collector of the publisher's socket
// counters, with the given constant labels:
//
//	kvgate_kv_events_peers{socket}                     connected subscribers / replay clients
//	kvgate_kv_events_sent_total{socket}                messages written
//	kvgate_kv_events_dropped_total                     batches dropped for subscribers whose queue was full
//	kvgate_kv_events_peers_closed_total{socket,reason} connections refused or closed by a limit
//	kvgate_kv_events_replays_total{result}             replay requests served or ignored (busy)
func (p *Publisher) Collector(labels prometheus.Labels) prometheus.Collector {
	d := func(name, help string, vars ...string) *prometheus.Desc {
		return prometheus.NewDesc(name, help, vars, labels)
	}
	return &collector{
		p:       p,
		peers:   d("kvgate_kv_events_peers", "Connected KV-event subscribers (socket=pub) and replay clients (socket=replay).", "socket"),
		sent:    d("kvgate_kv_events_sent_total", "KV-event messages written.", "socket"),
		dropped: d("kvgate_kv_events_dropped_total", "KV-event batches dropped for subscribers whose send queue was full."),
		closed:  d("kvgate_kv_events_peers_closed_total", "KV-event connections refused or closed by a limit.", "socket", "reason"),
		replay:  d("kvgate_kv_events_replays_total", "Replay requests: served, or ignored while the client's previous replay ran.", "result"),
	}
}

func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.peers, c.sent, c.dropped, c.closed, c.replay} {
		ch <- d
	}
}

func (c *collector) Collect(ch chan<- prometheus.Metric) {
	st := c.p.Stats()
	counter := func(d *prometheus.Desc, v uint64, lv ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), lv...)
	}
	type named struct {
		name string
		st   zmtp.Stats
	}
	socks := []named{{"pub", st.PUB}}
	if c.p.router != nil {
		socks = append(socks, named{"replay", st.Replay})
	}
	for _, s := range socks {
		ch <- prometheus.MustNewConstMetric(c.peers, prometheus.GaugeValue, float64(s.st.Peers), s.name)
		counter(c.sent, s.st.Sent, s.name)
		for _, r := range []struct {
			reason string
			v      uint64
		}{
			{"peer_limit", s.st.Refused}, {"handshake", s.st.HandshakeFailures}, {"oversize", s.st.Oversize},
			{"protocol", s.st.ProtocolErrors}, {"read_timeout", s.st.ReadTimeouts},
			{"write_timeout", s.st.WriteTimeouts}, {"recv_buffer", s.st.RecvBufferFull},
		} {
			counter(c.closed, r.v, s.name, r.reason)
		}
	}
	counter(c.dropped, st.PUB.Dropped)
	counter(c.replay, st.Replays, "served")
	counter(c.replay, st.ReplaysBusy, "busy")
}
