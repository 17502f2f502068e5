package gateway

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvgate/kvgate/internal/load"
	"github.com/kvgate/kvgate/internal/replicasync"
)

// syncLocal applies the peers' events: each model's load fleet, and the
// index's routed entries.
type syncLocal struct{ g *Gateway }

func (s syncLocal) LoadFleet(model string) *load.Fleet {
	s.g.mu.RLock()
	defer s.g.mu.RUnlock()
	if mf := s.g.models[model]; mf != nil {
		return mf.load
	}
	return nil
}

// member is the endpoint a peer names, if it is one of model's here.
func (s syncLocal) member(model, endpoint string) *member {
	s.g.mu.RLock()
	m := s.g.members[endpoint]
	s.g.mu.RUnlock()
	if m == nil || m.ep.Model != model || m.removed.Load() {
		return nil
	}
	return m
}

func (s syncLocal) Place(model, endpoint, adapter string) (func(), bool) {
	m := s.member(model, endpoint)
	if m == nil {
		return nil, false
	}
	return m.lora.start(adapter), true
}

func (s syncLocal) Prefix(model, endpoint string, keys []uint64, routed bool) bool {
	m := s.member(model, endpoint)
	if m == nil {
		return false
	}
	if routed {
		s.g.idx.Routed(m.kvID, keys)
	} else {
		s.g.idx.Unrouted(m.kvID, keys)
	}
	return true
}

func (s syncLocal) Response(model, endpoint, id string) bool {
	if s.member(model, endpoint) == nil {
		return false
	}
	s.g.respHolders.learn(id, endpoint)
	return true
}

// syncCollector exports the replica sync's counters at scrape time.
type syncCollector struct{ s *replicasync.Sync }

var (
	descSyncEvents  = prometheus.NewDesc("kvgate_sync_events_total", "Replica sync events by fate: sent, send_dropped (this replica's, not sent), received, applied, ignored (unknown model, endpoint or flight), refused (malformed or beyond a limit; messages).", []string{"fate"}, nil)
	descSyncExpired = prometheus.NewDesc("kvgate_sync_expired_flights_total", "Peers' flights ended without their end heard: by a heartbeat's live set, or by the peer's silence.", []string{"by"}, nil)
	descSyncPeers   = prometheus.NewDesc("kvgate_sync_peers", "Peer replicas heard within three heartbeats.", nil, nil)
	descSyncFlights = prometheus.NewDesc("kvgate_sync_peer_flights", "Peers' requests in flight loaded on this replica's view of the fleet.", nil, nil)
)

func (c syncCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descSyncEvents, descSyncExpired, descSyncPeers, descSyncFlights} {
		ch <- d
	}
}

func (c syncCollector) Collect(ch chan<- prometheus.Metric) {
	st := c.s.Stats()
	for _, e := range []struct {
		fate string
		n    uint64
	}{{"sent", st.Sent}, {"send_dropped", st.SendDropped}, {"received", st.Received}, {"applied", st.Applied},
		{"ignored", st.Ignored}, {"refused", st.Refused}} {
		ch <- prometheus.MustNewConstMetric(descSyncEvents, prometheus.CounterValue, float64(e.n), e.fate)
	}
	ch <- prometheus.MustNewConstMetric(descSyncExpired, prometheus.CounterValue, float64(st.ExpiredByHeartbeat), "heartbeat")
	ch <- prometheus.MustNewConstMetric(descSyncExpired, prometheus.CounterValue, float64(st.BySilence), "silence")
	ch <- prometheus.MustNewConstMetric(descSyncPeers, prometheus.GaugeValue, float64(st.Peers))
	ch <- prometheus.MustNewConstMetric(descSyncFlights, prometheus.GaugeValue, float64(st.PeerFlights))
}
