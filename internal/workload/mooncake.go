package workload

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
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
func ReadMooncake(r io.Reader, timeScale float64) (*Trace, error) {
	if !(timeScale > 0) {
		return nil, fmt.Errorf("mooncake trace: time scale must be > 0, got %v", timeScale)
	}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 1<<16), 1<<26)
	tr := &Trace{Name: "mooncake", BlockSize: MooncakeBlockTokens}
	first := 0.0
	line := 0
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
		if *m.InputLength <= 0 || *m.OutputLength < 0 || *m.Timestamp < 0 {
			return nil, fmt.Errorf("mooncake trace line %d: lengths and timestamp must be >= 0 and input_length > 0", line)
		}
		if len(tr.Requests) == 0 {
			first = *m.Timestamp
		}
		at := (*m.Timestamp - first) / 1000 * timeScale
		if n := len(tr.Requests); n > 0 && at < tr.Requests[n-1].Arrival {
			return nil, fmt.Errorf("mooncake trace line %d: timestamp %v goes back in time", line, *m.Timestamp)
		}
		full := min(len(m.HashIDs), *m.InputLength/MooncakeBlockTokens)
		keys := make([]uint64, full)
		for i := range keys {
			// Hash ids already identify whole prefixes; offset them so no
			// key collides with the generators' chained keys' root.
			keys[i] = uint64(m.HashIDs[i])<<1 | 1<<63
		}
		tr.Requests = append(tr.Requests, Request{Arrival: at, PromptTokens: *m.InputLength, OutputTokens: *m.OutputLength, Keys: keys, Session: -1})
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("mooncake trace: %w", err)
	}
	if len(tr.Requests) == 0 {
		return nil, fmt.Errorf("mooncake trace: no requests")
	}
	tr.Duration = tr.Requests[len(tr.Requests)-1].Arrival
	if tr.Duration <= 0 {
		tr.Duration = 1
	}
	return tr, nil
}
