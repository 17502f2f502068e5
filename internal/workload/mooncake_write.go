package workload

import (
	"bufio"
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
	var ids idSpace
	full, partial := map[uint64]int64{}, map[tail]int64{}
	bw := bufio.NewWriter(w)
	var line, hash []byte
	for i := range t.Requests {
		r := &t.Requests[i]
		hash = hash[:0]
		for b := 0; b*MooncakeBlockTokens < r.PromptTokens; b++ {
			lo, hi := b*per, min((b+1)*per, len(r.Keys))
			var id int64
			switch {
			case (b+1)*MooncakeBlockTokens <= r.PromptTokens && hi-lo == per:
				id = intern(&ids, full, r.Keys[hi-1])
			case hi > lo:
				id = intern(&ids, partial, tail{r.Keys[hi-1], r.PromptTokens - b*MooncakeBlockTokens})
			default:
				id = ids.fresh()
			}
			if b > 0 {
				hash = append(hash, ',')
			}
			hash = strconv.AppendInt(hash, id, 10)
		}
		line = mooncakeLineJSON(line[:0], r, hash)
		if _, err := bw.Write(line); err != nil {
			return fmt.Errorf("mooncake trace: %w", err)
		}
	}
	if err := bw.Flush(); err != nil {
		return fmt.Errorf("mooncake trace: %w", err)
	}
	return nil
}

// idSpace hands out dense hash ids from 0.
type idSpace struct{ next int64 }

func (s *idSpace) fresh() int64 { s.next++; return s.next - 1 }

// intern is k's id in m, a fresh one from s at k's first appearance.
func intern[K comparable](s *idSpace, m map[K]int64, k K) int64 {
	v, ok := m[k]
	if !ok {
		v = s.fresh()
		m[k] = v
	}
	return v
}

// mooncakeLineJSON appends r's line (arrival in ms to the microsecond;
// hash: its ids, comma-separated).
func mooncakeLineJSON(b []byte, r *Request, hash []byte) []byte {
	b = append(b, `{"timestamp": `...)
	b = strconv.AppendFloat(b, r.Arrival*1000, 'f', 3, 64)
	b = append(b, `, "input_length": `...)
	b = strconv.AppendInt(b, int64(r.PromptTokens), 10)
	b = append(b, `, "output_length": `...)
	b = strconv.AppendInt(b, int64(r.OutputTokens), 10)
	b = append(b, `, "hash_ids": [`...)
	b = append(b, hash...)
	return append(b, "]}\n"...)
}
