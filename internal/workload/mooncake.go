package workload

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"

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

// MooncakeRecord is one line of a Mooncake-format trace, checked.
type MooncakeRecord struct {
	Line                      int // its number in the file, from 1
	TimestampMs               float64
	InputLength, OutputLength int
	HashIDs                   []int64 // each >= 0
}

// ScanMooncake reads a Mooncake-format trace: JSON lines of {"timestamp":
// ms, "input_length": n, "output_length": n, "hash_ids": [...]}, each hash
// id a 512-token block whose equal ids are equal prefixes, and calls fn
// with each line in order (blank lines skipped). Every line is checked
// before fn sees it, and a bad one is an error naming its line: the three
// numbers present and in range (timestamps in [0, MaxTimestampMs],
// input_length in [1, MaxPromptTokens], output_length in [0,
// MaxOutputTokens]), one hash id >= 0 a 512-token block (⌈input_length /
// 512⌉, as Mooncake's traces have), timestamps never going back, at most
// MaxRequests lines. fn's error stops the scan and is returned. The
// simulator and kvgate bench read traces with it, so both accept the same
// files.
func ScanMooncake(r io.Reader, fn func(MooncakeRecord) error) error {
	var (
		tsRange  = flagrange.Range[float64]{Min: 0, Max: MaxTimestampMs, Unit: "ms"}
		inRange  = flagrange.Range[int]{Min: 1, Max: MaxPromptTokens, Unit: "tokens"}
		outRange = flagrange.Range[int]{Min: 0, Max: MaxOutputTokens, Unit: "tokens"}
	)
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 1<<16), 1<<26)
	line, n, last := 0, 0, 0.0
	for sc.Scan() {
		line++
		b := sc.Bytes()
		if len(bytes.TrimSpace(b)) == 0 {
			continue
		}
		var m mooncakeLine
		if err := json.Unmarshal(b, &m); err != nil {
			return fmt.Errorf("mooncake trace line %d: %w", line, lineError(err))
		}
		if m.Timestamp == nil || m.InputLength == nil || m.OutputLength == nil {
			return fmt.Errorf("mooncake trace line %d: need timestamp, input_length and output_length", line)
		}
		if err := errors.Join(
			tsRange.Check("timestamp", *m.Timestamp),
			inRange.Check("input_length", *m.InputLength),
			outRange.Check("output_length", *m.OutputLength),
		); err != nil {
			return fmt.Errorf("mooncake trace line %d: %w", line, err)
		}
		if n == MaxRequests {
			return fmt.Errorf("mooncake trace line %d: more than %d requests", line, MaxRequests)
		}
		if n > 0 && *m.Timestamp < last {
			return fmt.Errorf("mooncake trace line %d: timestamp %v goes back in time", line, *m.Timestamp)
		}
		for _, id := range m.HashIDs {
			if id < 0 {
				return fmt.Errorf("mooncake trace line %d: hash id %d is negative", line, id)
			}
		}
		if want := (*m.InputLength + MooncakeBlockTokens - 1) / MooncakeBlockTokens; len(m.HashIDs) != want {
			// A line without its ids, or with too few, would be simulated
			// as a prompt sharing nothing (or a long one as one block).
			return fmt.Errorf("mooncake trace line %d: %d hash ids for input_length %d: want %d, one per 512-token block", line, len(m.HashIDs), *m.InputLength, want)
		}
		n, last = n+1, *m.Timestamp
		if err := fn(MooncakeRecord{Line: line, TimestampMs: *m.Timestamp, InputLength: *m.InputLength, OutputLength: *m.OutputLength, HashIDs: m.HashIDs}); err != nil {
			return err
		}
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("mooncake trace: %w", err)
	}
	if n == 0 {
		return fmt.Errorf("mooncake trace: no requests")
	}
	return nil
}

// lineError says what is wrong with a line that does not decode, in the
// file's terms (encoding/json's type errors name Go types).
func lineError(err error) error {
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) {
		if te.Field == "" {
			return fmt.Errorf("want a JSON object with timestamp, input_length, output_length and hash_ids, got a JSON %s", te.Value)
		}
		switch {
		case strings.HasPrefix(te.Value, "number "): // a number that does not fit: 100.7, 1e30
			return fmt.Errorf("%s: %s is not an integer in range", te.Field, strings.TrimPrefix(te.Value, "number "))
		case te.Field == "hash_ids" || strings.HasPrefix(te.Field, "hash_ids"):
			return fmt.Errorf("%s: a JSON %s where a list of integers belongs", te.Field, te.Value)
		}
		return fmt.Errorf("%s: a JSON %s where a number belongs", te.Field, te.Value)
	}
	return fmt.Errorf("want a JSON object with timestamp, input_length, output_length and hash_ids: %w", err)
}

// ReadMooncake reads a Mooncake-format trace (ScanMooncake) as a workload:
// timeScale multiplies arrival times (0.5 compresses the trace to twice
// the rate), counted from the first, and a trace holds at most MaxKeys
// blocks. Its Duration is the span of its arrivals, at least 1 ms (1 s
// when all arrive at once), so rates computed from it are finite.
func ReadMooncake(r io.Reader, timeScale float64) (*Trace, error) {
	if err := ParamLimits().TimeScale.Check("time scale", timeScale); err != nil {
		return nil, fmt.Errorf("mooncake trace: %w", err)
	}
	tr := &Trace{Name: "mooncake", BlockSize: MooncakeBlockTokens}
	first, blocks := 0.0, 0
	err := ScanMooncake(r, func(m MooncakeRecord) error {
		if len(tr.Requests) == 0 {
			first = m.TimestampMs
		}
		full := min(len(m.HashIDs), m.InputLength/MooncakeBlockTokens)
		if blocks += full; blocks > MaxKeys {
			return fmt.Errorf("mooncake trace line %d: more than %d blocks in all", m.Line, MaxKeys)
		}
		keys := make([]uint64, full)
		for i := range keys {
			keys[i] = mooncakeKey(m.HashIDs[i])
		}
		at := (m.TimestampMs - first) / 1000 * timeScale
		if at > MaxTraceSpan {
			return fmt.Errorf("mooncake trace line %d: arrives %.4g s after the first (time scale %g), more than %g s: the simulated clock would lose its precision (at 1e16 s a float's step is 2 s); use a smaller --time-scale",
				m.Line, at, timeScale, float64(MaxTraceSpan))
		}
		tr.Requests = append(tr.Requests, Request{Arrival: at, PromptTokens: m.InputLength, OutputTokens: m.OutputLength, Keys: keys, Session: -1})
		return nil
	})
	if err != nil {
		return nil, err
	}
	switch last := tr.Requests[len(tr.Requests)-1].Arrival; {
	case last <= 0:
		tr.Duration = 1
	default:
		tr.Duration = max(last, minTraceSpan)
	}
	return tr, nil
}

// MaxTraceSpan bounds a replayed trace's span in (scaled) seconds, about
// 32 years: a float64's step there is 0.1 µs, finer than any latency
// simulated (the timestamp and time-scale ranges alone allow 1e19 s).
const MaxTraceSpan = 1e9

// minTraceSpan is the shortest Duration of a trace whose arrivals are not
// all at one instant: arrivals closer than that (or a time scale that makes
// them so) would otherwise give rates that overflow to +Inf.
const minTraceSpan = 1e-3

// mooncakeKey maps a hash id (>= 0) to a block key. Hash ids already name
// whole prefixes, so the key is the id itself with bit 63 set: one key per
// id (ids differing in any bit, bit 62 included, stay apart), and never the
// chained keys' root, whose bit 63 is clear.
func mooncakeKey(id int64) uint64 { return uint64(id) | 1<<63 }
