package enginemetrics

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
)

// metricID names a sample this package reads; every other sample is
// skipped after its name is read. vLLM's ids come before SGLang's
// (result tells the flavour by range).
type metricID uint8

const (
	mNone metricID = iota
	mVLLMWaiting
	mVLLMRunning
	mVLLMKVUsage
	mVLLMGPUUsage // deprecated name of kv_cache_usage_perc
	mVLLMCacheConfig
	mVLLMPrefixQueries
	mVLLMPrefixHits
	mVLLMGPUPrefixQueries // older V1 names
	mVLLMGPUPrefixHits
	mVLLMLoRAInfo
	mSGLangQueue
	mSGLangRunning
	mSGLangTokenUsage
	mSGLangHitRate
	mSGLangMaxTokens
	numMetrics
)

// lookup maps a sample name to what it means; a string switch on a byte
// slice does not allocate.
func lookup(name []byte) metricID {
	switch string(name) {
	case "vllm:num_requests_waiting":
		return mVLLMWaiting
	case "vllm:num_requests_running":
		return mVLLMRunning
	case "vllm:kv_cache_usage_perc":
		return mVLLMKVUsage
	case "vllm:gpu_cache_usage_perc":
		return mVLLMGPUUsage
	case "vllm:cache_config_info":
		return mVLLMCacheConfig
	case "vllm:prefix_cache_queries_total":
		return mVLLMPrefixQueries
	case "vllm:prefix_cache_hits_total":
		return mVLLMPrefixHits
	case "vllm:gpu_prefix_cache_queries_total":
		return mVLLMGPUPrefixQueries
	case "vllm:gpu_prefix_cache_hits_total":
		return mVLLMGPUPrefixHits
	case "vllm:lora_requests_info":
		return mVLLMLoRAInfo
	case "sglang:num_queue_reqs":
		return mSGLangQueue
	case "sglang:num_running_reqs":
		return mSGLangRunning
	case "sglang:token_usage":
		return mSGLangTokenUsage
	case "sglang:cache_hit_rate":
		return mSGLangHitRate
	case "sglang:max_total_num_tokens":
		return mSGLangMaxTokens
	}
	return mNone
}

// Limits on what one exposition may hold.
const (
	maxLineLen       = 64 << 10 // a longer line of a metric we read is an error
	maxSeriesPerName = 1024     // label sets of one metric we read
	maxLabels        = 64       // labels on one sample we read
)

// label is one parsed name="value" pair.
type label struct{ name, value string }

// series is one label set of a metric we read, after replica labels are
// dropped (see groupKey).
type series struct {
	key   string
	value float64
	// block size and GPU blocks, for vllm:cache_config_info.
	blockSize, gpuBlocks int
	hasConfig            bool
	// for vllm:lora_requests_info: its labels.
	lora *loraLabels
}

// loraLabels are a vllm:lora_requests_info series' labels.
type loraLabels struct {
	maxLoRA          int
	running, waiting string
}

// parser reads the Prometheus text format line by line, keeping only the
// samples lookup knows and only for the wanted model.
type parser struct {
	model  string
	rank   string // "": every data-parallel rank
	line   int
	labels []label
	seen   [numMetrics][]series
}

// replicaLabels mark series that are views of one scheduler (tensor,
// pipeline and expert parallel ranks report the same queue; and the API
// server processes of a vLLM run with --api-server-count, whose gauges
// prometheus_client's multiprocess mode exports one a pid, a process that
// got no stats keeping a stale one): within one group they are
// de-duplicated (max), not summed. (pid was taken for a rank: a usage of
// 0.8 and a stale 0.0 read 0.4.)
func isReplicaLabel(name string) bool {
	switch name {
	case "tp_rank", "pp_rank", "moe_ep_rank", "attn_tp_rank", "pid":
		return true
	}
	return false
}

// isRankLabel: the label naming the data-parallel rank a series is of
// (vLLM's engine index, SGLang's dp_rank).
func isRankLabel(name string) bool { return name == "engine" || name == "dp_rank" }

// parse reads an exposition from r.
func (p *parser) parse(r io.Reader) error {
	br := bufio.NewReaderSize(r, maxLineLen)
	for {
		p.line++
		b, err := br.ReadSlice('\n')
		if errors.Is(err, bufio.ErrBufferFull) {
			if id := lookup(sampleName(trimBlank(b))); id != mNone {
				return fmt.Errorf("line %d: longer than %d bytes", p.line, maxLineLen)
			}
			if err := skipLine(br); err != nil {
				return err
			}
			continue
		}
		if len(b) > 0 {
			if perr := p.parseLine(b); perr != nil {
				return fmt.Errorf("line %d: %w", p.line, perr)
			}
		}
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
	}
}

// skipLine discards the rest of an over-long line.
func skipLine(br *bufio.Reader) error {
	for {
		_, err := br.ReadSlice('\n')
		switch {
		case errors.Is(err, bufio.ErrBufferFull):
			continue
		case err == io.EOF:
			return nil
		default:
			return err
		}
	}
}

func trimBlank(b []byte) []byte {
	for len(b) > 0 && (b[0] == ' ' || b[0] == '\t') {
		b = b[1:]
	}
	for len(b) > 0 {
		c := b[len(b)-1]
		if c != ' ' && c != '\t' && c != '\r' && c != '\n' {
			break
		}
		b = b[:len(b)-1]
	}
	return b
}

// sampleName returns the metric name at the start of a sample line.
func sampleName(b []byte) []byte {
	if i := bytes.IndexAny(b, "{ \t"); i >= 0 {
		return b[:i]
	}
	return b
}

func (p *parser) parseLine(b []byte) error {
	b = trimBlank(b)
	if len(b) == 0 || b[0] == '#' {
		return nil
	}
	name := sampleName(b)
	id := lookup(name)
	if id == mNone {
		return nil
	}
	rest := trimBlank(b[len(name):])
	p.labels = p.labels[:0]
	if len(rest) > 0 && rest[0] == '{' {
		var err error
		if rest, err = p.parseLabels(rest[1:]); err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
	}
	v, err := parseValue(trimBlank(rest))
	if err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	if math.IsNaN(v) {
		return nil // no information
	}
	return p.add(id, v)
}

// parseValue reads "VALUE [TIMESTAMP]".
func parseValue(b []byte) (float64, error) {
	if len(b) == 0 {
		return 0, errors.New("missing value")
	}
	tok, ts := b, []byte(nil)
	if i := bytes.IndexAny(b, " \t"); i >= 0 {
		tok, ts = b[:i], trimBlank(b[i:])
	}
	v, err := strconv.ParseFloat(string(tok), 64)
	if err != nil {
		return 0, fmt.Errorf("value %q is not a number", tok)
	}
	if len(ts) > 0 {
		if _, err := strconv.ParseInt(string(ts), 10, 64); err != nil {
			return 0, fmt.Errorf("timestamp %q is not an integer", ts)
		}
	}
	return v, nil
}

// parseLabels reads `name="value",...}` (the opening brace consumed) and
// returns what follows the closing brace.
func (p *parser) parseLabels(b []byte) ([]byte, error) {
	for {
		b = trimBlank(b)
		if len(b) == 0 {
			return nil, errors.New("unterminated label set")
		}
		if b[0] == '}' {
			return b[1:], nil
		}
		n := labelNameLen(b)
		if n == 0 {
			return nil, fmt.Errorf("bad label name at %q", clip(b))
		}
		name := string(b[:n])
		b = trimBlank(b[n:])
		if len(b) == 0 || b[0] != '=' {
			return nil, fmt.Errorf("label %s: missing =", name)
		}
		b = trimBlank(b[1:])
		if len(b) == 0 || b[0] != '"' {
			return nil, fmt.Errorf("label %s: value is not quoted", name)
		}
		value, rest, err := unquote(b[1:])
		if err != nil {
			return nil, fmt.Errorf("label %s: %w", name, err)
		}
		if len(p.labels) == maxLabels {
			return nil, fmt.Errorf("more than %d labels", maxLabels)
		}
		p.labels = append(p.labels, label{name, value})
		b = trimBlank(rest)
		if len(b) > 0 && b[0] == ',' {
			b = b[1:]
		} else if len(b) == 0 || b[0] != '}' {
			return nil, fmt.Errorf("label %s: expected , or }", name)
		}
	}
}

// labelNameLen is the length of the label name [a-zA-Z_][a-zA-Z0-9_]* at
// the start of b.
func labelNameLen(b []byte) int {
	for i, c := range b {
		switch {
		case c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z':
		case c >= '0' && c <= '9' && i > 0:
		default:
			return i
		}
	}
	return len(b)
}

// unquote reads a label value up to its closing quote (the opening one
// consumed), resolving the format's three escapes.
func unquote(b []byte) (string, []byte, error) {
	var sb strings.Builder
	for i := 0; i < len(b); i++ {
		switch c := b[i]; c {
		case '"':
			return sb.String(), b[i+1:], nil
		case '\\':
			if i+1 == len(b) {
				return "", nil, errors.New("unterminated value")
			}
			i++
			switch b[i] {
			case '\\':
				sb.WriteByte('\\')
			case '"':
				sb.WriteByte('"')
			case 'n':
				sb.WriteByte('\n')
			default:
				return "", nil, fmt.Errorf("bad escape \\%c", b[i])
			}
		default:
			sb.WriteByte(c)
		}
	}
	return "", nil, errors.New("unterminated value")
}

func clip(b []byte) []byte {
	if len(b) > 32 {
		return b[:32]
	}
	return b
}

// add records one sample: dropped when it is for another model, else
// merged into its group (max over replicas of one group).
func (p *parser) add(id metricID, v float64) error {
	var key strings.Builder
	var s series
	for _, l := range p.labels {
		switch {
		case l.name == "model_name" && p.model != "" && l.value != p.model:
			return nil
		case isRankLabel(l.name) && p.rank != "" && l.value != p.rank:
			return nil
		case isReplicaLabel(l.name):
			continue
		case id == mVLLMCacheConfig && l.name == "block_size":
			s.blockSize, s.hasConfig = parseCount(l.value), true
		case id == mVLLMCacheConfig && l.name == "num_gpu_blocks":
			s.gpuBlocks = parseCount(l.value)
		case id == mVLLMLoRAInfo:
			s.setLoRALabel(l)
		}
		key.WriteString(l.name)
		key.WriteByte(0)
		key.WriteString(l.value)
		key.WriteByte(0)
	}
	s.key, s.value = key.String(), v
	list := p.seen[id]
	for i := range list {
		if list[i].key == s.key {
			if v > list[i].value {
				list[i].value = v
			}
			return nil
		}
	}
	if len(list) == maxSeriesPerName {
		return fmt.Errorf("more than %d label sets", maxSeriesPerName)
	}
	p.seen[id] = append(list, s)
	return nil
}

// setLoRALabel keeps l if it is one of vllm:lora_requests_info's.
func (s *series) setLoRALabel(l label) {
	if s.lora == nil {
		s.lora = &loraLabels{}
	}
	switch l.name {
	case "max_lora":
		s.lora.maxLoRA = parseCount(l.value)
	case "running_lora_adapters":
		s.lora.running = l.value
	case "waiting_lora_adapters":
		s.lora.waiting = l.value
	}
}

// parseCount reads a non-negative integer label ("None" and junk read as 0:
// unknown).
func parseCount(s string) int {
	n, err := strconv.Atoi(s)
	if err != nil || n < 0 || n > maxCount {
		return 0
	}
	return n
}
