package workload

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"strconv"
)

// WriteMooncake writes t as a Mooncake-format trace (ReadMooncake's
// format, the one `kvgate bench --workload trace` replays): one JSON line
// per request, its arrival in milliseconds, its lengths, and one hash id
// per 512-token block of its prompt, equal ids for equal prefixes.
//
// t's blocks must divide 512 tokens: MooncakeBlockTokens / t.BlockSize of
// its chained keys make one hash block, named by the last of them (a
// chained key names its whole prefix). A prompt's last, partial hash block
// is named by its last key and its length when it holds a key, so that
// two prompts share it exactly where the trace says their blocks are
// equal; one shorter than a block of t has its own id, as it shares
// nothing a prefix cache could hold.
func WriteMooncake(w io.Writer, t *Trace) error {
	if t.BlockSize <= 0 || MooncakeBlockTokens%t.BlockSize != 0 {
		return fmt.Errorf("mooncake trace: blocks of %d tokens do not divide %d", t.BlockSize, MooncakeBlockTokens)
	}
	per := MooncakeBlockTokens / t.BlockSize
	type tail struct {
		key    uint64
		tokens int
	}
	full, partial := map[uint64]int64{}, map[tail]int64{}
	next := int64(0)
	id := func(ids map[uint64]int64, k uint64) int64 {
		v, ok := ids[k]
		if !ok {
			v, next = next, next+1
			ids[k] = v
		}
		return v
	}
	bw := bufio.NewWriter(w)
	var line []byte
	for i := range t.Requests {
		r := &t.Requests[i]
		n := (r.PromptTokens + MooncakeBlockTokens - 1) / MooncakeBlockTokens
		ids := make([]int64, 0, n)
		for b := 0; b < n; b++ {
			lo, hi := b*per, min((b+1)*per, len(r.Keys))
			switch {
			case (b+1)*MooncakeBlockTokens <= r.PromptTokens && hi-lo == per:
				ids = append(ids, id(full, r.Keys[hi-1]))
			case hi > lo:
				tk := tail{r.Keys[hi-1], r.PromptTokens - b*MooncakeBlockTokens}
				v, ok := partial[tk]
				if !ok {
					v, next = next, next+1
					partial[tk] = v
				}
				ids = append(ids, v)
			default:
				ids = append(ids, next)
				next++
			}
		}
		var err error
		if line, err = mooncakeJSON(line[:0], r, ids); err != nil {
			return fmt.Errorf("mooncake trace: request %d: %w", i, err)
		}
		if _, err := bw.Write(line); err != nil {
			return fmt.Errorf("mooncake trace: %w", err)
		}
	}
	if err := bw.Flush(); err != nil {
		return fmt.Errorf("mooncake trace: %w", err)
	}
	return nil
}

// mooncakeJSON appends r's line (arrival in ms to the microsecond).
func mooncakeJSON(b []byte, r *Request, ids []int64) ([]byte, error) {
	hash, err := json.Marshal(ids)
	if err != nil {
		return nil, err
	}
	b = append(b, `{"timestamp": `...)
	b = strconv.AppendFloat(b, r.Arrival*1000, 'f', 3, 64)
	b = append(b, `, "input_length": `...)
	b = strconv.AppendInt(b, int64(r.PromptTokens), 10)
	b = append(b, `, "output_length": `...)
	b = strconv.AppendInt(b, int64(r.OutputTokens), 10)
	b = append(b, `, "hash_ids": `...)
	b = append(b, hash...)
	return append(b, "}\n"...), nil
}
