package workload

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"

	"github.com/kvgate/kvgate/internal/flagrange"
)

// MooncakeBlockTokens is the block size of Mooncake traces' hash ids.
const MooncakeBlockTokens = 512

type mooncakeLine struct {
	Timestamp    *float64 `json:"timestamp"`
	InputLength  *int     `json:"input_length"`
	OutputLength *int     `json:"output_length"`
	HashIDs      []int64  `json:"hash_ids"`
}

// ReadMooncake reads a Mooncake-format trace: JSON lines of {"timestamp": ms,
// "input_length": n, "output_length": n, "hash_ids": [...]}, each hash id a
// 512-token block whose equal ids are equal prefixes. timeScale multiplies
// arrival times (0.5 compresses the trace to twice the rate). Bad lines are
// reported with their line number; nothing is silently dropped.
//
// Every number has a range: timestamps in [0, MaxTimestampMs], input_length
// in [1, MaxPromptTokens], output_length in [0, MaxOutputTokens], hash ids
// >= 0, and a trace holds at most MaxRequests lines and MaxKeys blocks. Its
// Duration is the span of its arrivals, at least 1 ms (1 s when all arrive
// at once), so rates computed from it are finite.
func ReadMooncake(r io.Reader, timeScale float64) (*Trace, error) {
	if err := ParamLimits().TimeScale.Check("time scale", timeScale); err != nil {
		return nil, fmt.Errorf("mooncake trace: %w", err)
	}
	var (
		tsRange  = flagrange.Range[float64]{Min: 0, Max: MaxTimestampMs, Unit: "ms"}
		inRange  = flagrange.Range[int]{Min: 1, Max: MaxPromptTokens, Unit: "tokens"}
		outRange = flagrange.Range[int]{Min: 0, Max: MaxOutputTokens, Unit: "tokens"}
	)
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 1<<16), 1<<26)
	tr := &Trace{Name: "mooncake", BlockSize: MooncakeBlockTokens}
	first := 0.0
	line, blocks := 0, 0
	for sc.Scan() {
		line++
		b := sc.Bytes()
		if len(b) == 0 {
			continue
		}
		var m mooncakeLine
		if err := json.Unmarshal(b, &m); err != nil {
			return nil, fmt.Errorf("mooncake trace line %d: %w", line, err)
		}
		if m.Timestamp == nil || m.InputLength == nil || m.OutputLength == nil {
			return nil, fmt.Errorf("mooncake trace line %d: need timestamp, input_length and output_length", line)
		}
		if err := errors.Join(
			tsRange.Check("timestamp", *m.Timestamp),
			inRange.Check("input_length", *m.InputLength),
			outRange.Check("output_length", *m.OutputLength),
		); err != nil {
			return nil, fmt.Errorf("mooncake trace line %d: %w", line, err)
		}
		if len(tr.Requests) == MaxRequests {
			return nil, fmt.Errorf("mooncake trace line %d: more than %d requests", line, MaxRequests)
		}
		if len(tr.Requests) == 0 {
			first = *m.Timestamp
		}
		at := (*m.Timestamp - first) / 1000 * timeScale
		if n := len(tr.Requests); n > 0 && at < tr.Requests[n-1].Arrival {
			return nil, fmt.Errorf("mooncake trace line %d: timestamp %v goes back in time", line, *m.Timestamp)
		}
		for _, id := range m.HashIDs {
			if id < 0 {
				return nil, fmt.Errorf("mooncake trace line %d: hash id %d is negative", line, id)
			}
		}
		full := min(len(m.HashIDs), *m.InputLength/MooncakeBlockTokens)
		if blocks += full; blocks > MaxKeys {
			return nil, fmt.Errorf("mooncake trace line %d: more than %d blocks in all", line, MaxKeys)
		}
		keys := make([]uint64, full)
		for i := range keys {
			keys[i] = mooncakeKey(m.HashIDs[i])
		}
		tr.Requests = append(tr.Requests, Request{Arrival: at, PromptTokens: *m.InputLength, OutputTokens: *m.OutputLength, Keys: keys, Session: -1})
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("mooncake trace: %w", err)
	}
	if len(tr.Requests) == 0 {
		return nil, fmt.Errorf("mooncake trace: no requests")
	}
	switch last := tr.Requests[len(tr.Requests)-1].Arrival; {
	case last <= 0:
		tr.Duration = 1
	default:
		tr.Duration = max(last, minTraceSpan)
	}
	return tr, nil
}

// minTraceSpan is the shortest Duration of a trace whose arrivals are not
// all at one instant: arrivals closer than that (or a time scale that makes
// them so) would otherwise give rates that overflow to +Inf.
const minTraceSpan = 1e-3

// mooncakeKey maps a hash id (>= 0) to a block key. Hash ids already name
// whole prefixes, so the key is the id itself with bit 63 set: one key per
// id (ids differing in any bit, bit 62 included, stay apart), and never the
// chained keys' root, whose bit 63 is clear.
func mooncakeKey(id int64) uint64 { return uint64(id) | 1<<63 }
