package tokens

import (
	"container/list"
	"context"
	"encoding/binary"
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"

	"github.com/cespare/xxhash/v2"

	"github.com/kvgate/kvgate/internal/kvspec"
)

// Tokenizer turns one model's requests into token ids: a Source, a chat
// Template and a cache of tokenized segments. Safe for concurrent use.
type Tokenizer struct {
	src   Source
	tmpl  Template
	exact bool // chat via the engine's own template (MessagesSource)
	cache *Cache
	// ns separates this tokenizer's entries in a shared cache: two models
	// with different tokenizers must never get each other's ids.
	ns uint64
}

// NewTokenizer combines a source, a template and a cache (nil: no cache).
// With exactChat and a MessagesSource, conversations are sent whole to the
// engine, which applies its real chat template (exact ids, one call per
// distinct conversation); otherwise they are rendered with tmpl and
// tokenized per message segment.
//
// namespace identifies the tokenizer in a shared cache (use a distinct one
// per distinct tokenizer: NewSet uses the model and the whole spec).
func NewTokenizer(src Source, tmpl Template, cache *Cache, exactChat bool, namespace string) *Tokenizer {
	_, ok := src.(MessagesSource)
	return &Tokenizer{src: src, tmpl: tmpl, cache: cache, exact: exactChat && ok, ns: xxhash.Sum64String(namespace)}
}

// Prompt tokenizes a completion prompt.
func (t *Tokenizer) Prompt(ctx context.Context, prompt string) ([]uint32, error) {
	ids, err := t.cached(ctx, 'p', prompt, t.src.Tokenize)
	if err != nil {
		return nil, err
	}
	return append([]uint32(nil), ids...), nil
}

// Chat tokenizes a conversation. Each rendered message segment is cached,
// so a growing conversation re-tokenizes only its new messages.
func (t *Tokenizer) Chat(ctx context.Context, msgs []Message) ([]uint32, error) {
	if t.exact {
		ms := t.src.(MessagesSource)
		key := t.tmpl.Render(msgs) // stable serialisation of the conversation
		ids, err := t.cached(ctx, 'm', key, func(ctx context.Context, _ string) ([]uint32, error) {
			return ms.TokenizeMessages(ctx, msgs)
		})
		if err != nil {
			return nil, err
		}
		return append([]uint32(nil), ids...), nil
	}
	segment := t.src.Tokenize
	if es, ok := t.src.(*EngineSource); ok {
		segment = es.tokenizeSegment
	}
	var out []uint32
	for _, seg := range t.tmpl.Segments(msgs) {
		ids, err := t.cached(ctx, 's', seg, segment)
		if err != nil {
			return nil, err
		}
		out = append(out, ids...)
	}
	return out, nil
}

func (t *Tokenizer) cached(ctx context.Context, kind byte, text string, f func(context.Context, string) ([]uint32, error)) ([]uint32, error) {
	if t.cache == nil {
		return f(ctx, text)
	}
	d := xxhash.New()
	var ns [9]byte
	binary.LittleEndian.PutUint64(ns[:8], t.ns)
	ns[8] = kind
	_, _ = d.Write(ns[:])
	_, _ = d.WriteString(text)
	key := d.Sum64()
	if ids, ok := t.cache.get(key); ok {
		return ids, nil
	}
	ids, err := f(ctx, text)
	if err != nil {
		return nil, err
	}
	t.cache.put(key, ids)
	return ids, nil
}

// Cache is an LRU of tokenized texts bounded by the total number of token
// ids it holds. Safe for concurrent use; share one across models.
type Cache struct {
	mu        sync.Mutex
	max       int
	size      int
	ll        *list.List
	m         map[uint64]*list.Element
	hits, mis atomic.Int64
}

type cacheEntry struct {
	key uint64
	ids []uint32
}

// NewCache returns a cache holding up to maxTokens token ids (default 4 Mi).
func NewCache(maxTokens int) *Cache {
	if maxTokens <= 0 {
		maxTokens = 4 << 20
	}
	return &Cache{max: maxTokens, ll: list.New(), m: map[uint64]*list.Element{}}
}

func (c *Cache) get(k uint64) ([]uint32, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if e, ok := c.m[k]; ok {
		c.ll.MoveToFront(e)
		c.hits.Add(1)
		return e.Value.(*cacheEntry).ids, true
	}
	c.mis.Add(1)
	return nil, false
}

func (c *Cache) put(k uint64, ids []uint32) {
	if len(ids) > c.max {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if e, ok := c.m[k]; ok {
		c.ll.MoveToFront(e)
		return
	}
	c.m[k] = c.ll.PushFront(&cacheEntry{key: k, ids: ids})
	c.size += len(ids)
	for c.size > c.max {
		e := c.ll.Back()
		ce := e.Value.(*cacheEntry)
		c.ll.Remove(e)
		delete(c.m, ce.key)
		c.size -= len(ce.ids)
	}
}

// Stats returns cache hits, misses and the token ids held.
func (c *Cache) Stats() (hits, misses int64, tokens int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.hits.Load(), c.mis.Load(), c.size
}

// Spec configures one model's tokenizer; see ParseSpec for its text form.
type Spec struct {
	Model         string // "" or "*": the default for models without a spec
	Source        string // "estimate" (default), "engine" or "local"
	URL           string // engine: base URL of an engine serving the model
	File          string // local: tokenizer file
	Template      string // chat template name (default chatml)
	BytesPerToken int    // estimate: bytes per pseudo-token (default 4)
	ExactChat     bool   // engine: send conversations to the engine's own template
}

// ParseSpec parses "model=m,source=engine,url=http://127.0.0.1:8001,
// template=llama3,exact_chat=true" (keys in any order; source=estimate
// takes bytes_per_token=N, source=local takes file=PATH).
func ParseSpec(s string) (Spec, error) {
	var sp Spec
	err := kvspec.Each(s, func(k, v string) error {
		switch k {
		case "model":
			sp.Model = v
		case "source":
			sp.Source = v
		case "url":
			sp.URL = v
		case "file":
			sp.File = v
		case "template":
			sp.Template = v
		case "bytes_per_token":
			n, err := strconv.Atoi(v)
			if err != nil || n <= 0 {
				return fmt.Errorf("bad bytes_per_token %q", v)
			}
			sp.BytesPerToken = n
		case "exact_chat":
			b, err := strconv.ParseBool(v)
			if err != nil {
				return fmt.Errorf("bad exact_chat %q", v)
			}
			sp.ExactChat = b
		default:
			return fmt.Errorf("unknown key %q", k)
		}
		return nil
	})
	if err != nil {
		return sp, fmt.Errorf("tokens: spec %q: %w", s, err)
	}
	return sp, nil
}

// Set holds the tokenizers of every model, with a default for the rest.
type Set struct {
	byModel map[string]*Tokenizer
	def     *Tokenizer
	cache   *Cache
}

// NewSet builds tokenizers from specs sharing one cache. Without a default
// spec the default is the byte estimate with the default template.
func NewSet(specs []Spec, cache *Cache, client *http.Client) (*Set, error) {
	s := &Set{byModel: map[string]*Tokenizer{}, cache: cache}
	for _, sp := range specs {
		t, err := build(sp, cache, client)
		if err != nil {
			return nil, err
		}
		if sp.Model == "" || sp.Model == "*" {
			s.def = t
		} else {
			s.byModel[sp.Model] = t
		}
	}
	if s.def == nil {
		t, err := build(Spec{}, cache, client)
		if err != nil {
			return nil, err
		}
		s.def = t
	}
	return s, nil
}

func build(sp Spec, cache *Cache, client *http.Client) (*Tokenizer, error) {
	tmpl, err := LookupTemplate(sp.Template)
	if err != nil {
		return nil, err
	}
	var src Source
	exact := sp.ExactChat
	switch sp.Source {
	case "", "estimate":
		src = EstimateSource{BytesPerToken: sp.BytesPerToken}
	case "engine":
		if sp.URL == "" {
			return nil, fmt.Errorf("tokens: model %q: source=engine needs url=", sp.Model)
		}
		src = &EngineSource{BaseURL: sp.URL, Model: sp.Model, Client: client}
	case "local":
		if sp.File == "" {
			return nil, fmt.Errorf("tokens: model %q: source=local needs file=", sp.Model)
		}
		ls, own, err := loadLocalSpec(sp, cache)
		if err != nil {
			return nil, err
		}
		src, exact = ls, own
	default:
		return nil, fmt.Errorf("tokens: model %q: unknown source %q (estimate, engine, local)", sp.Model, sp.Source)
	}
	ns := fmt.Sprintf("%q|%q|%q|%q|%d|%q|%v", sp.Model, sp.Source, sp.URL, sp.File, sp.BytesPerToken, sp.Template, sp.ExactChat)
	return NewTokenizer(src, tmpl, cache, exact, ns), nil
}

// For returns the tokenizer of model.
func (s *Set) For(model string) *Tokenizer {
	if t, ok := s.byModel[model]; ok {
		return t
	}
	return s.def
}

// Cache returns the shared cache (may be nil).
func (s *Set) Cache() *Cache { return s.cache }
