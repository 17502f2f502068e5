package tokens

import (
	"container/list"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/cespare/xxhash/v2"

	"github.com/kvgate/kvgate/internal/kvspec"
	"github.com/kvgate/kvgate/internal/openai"
)

// Tokenizer turns one model's requests into token ids: a Source, a chat
// Template and a cache of tokenized segments. Safe for concurrent use.
type Tokenizer struct {
	log   *slog.Logger // nil: slog.Default() (Set.SetLogger)
	src   Source
	tmpl  Template
	exact bool // chat via the engine's own template (MessagesSource)
	// noMessages is set once the engine refused a conversation and a
	// plain one after it (its /tokenize takes no "messages"): chats are
	// rendered with tmpl since. takesMessages is set once it took one.
	noMessages, takesMessages atomic.Bool
	cache                     *Cache
	// ns separates this tokenizer's entries in a shared cache: two models
	// with different tokenizers must never get each other's ids.
	ns uint64
	// inline is where the model's engines put a Messages request's
	// system messages inside messages (Spec.InlineSystem; "" or auto:
	// preserve, until folded is set).
	inline openai.InlineSystem
	folded atomic.Bool
}

// InlineSystem is where the model's engines put a Messages request's
// system messages inside messages, so that its conversations are
// converted as theirs (openai.ParseMessagesAs): as configured; auto is
// preserve until a refusal made it fold (FoldInline).
func (t *Tokenizer) InlineSystem() openai.InlineSystem {
	switch {
	case !t.InlineAuto():
		return t.inline
	case t.folded.Load():
		return openai.InlineFold
	}
	return openai.InlinePreserve
}

// InlineAuto reports whether the placement is auto.
func (t *Tokenizer) InlineAuto() bool {
	return t.inline == "" || t.inline == openai.InlineAuto
}

// FoldInline settles auto on fold (the engine or the template refused a
// system message in place and took it folded, as vLLM's auto probe
// decides); it reports whether this call settled it.
func (t *Tokenizer) FoldInline() bool {
	return t.InlineAuto() && !t.folded.Swap(true)
}

// NewTokenizer combines a source, a template and a cache (nil: no cache).
// With exactChat and a MessagesSource, conversations are sent whole to the
// engine, which applies its real chat template (exact ids, one call per
// distinct conversation; see Chat for the cache); otherwise they are
// rendered with tmpl and tokenized per message segment. An engine that
// refuses conversations (4xx) makes the tokenizer fall back on tmpl, with
// one warning.
//
// namespace identifies the tokenizer in a shared cache (use a distinct one
// per distinct tokenizer: NewSet uses the model and the whole spec).
func NewTokenizer(src Source, tmpl Template, cache *Cache, exactChat bool, namespace string) *Tokenizer {
	_, ok := src.(MessagesSource)
	return &Tokenizer{src: src, tmpl: tmpl, cache: cache, exact: exactChat && ok, ns: xxhash.Sum64String(namespace)}
}

// engineIDs reports whether the ids it gives a prompt (chat: a
// conversation) now are the engine's own: the source is not the estimate,
// whose ids mean nothing to an engine, and a conversation is rendered
// with the engine's own chat template.
func (t *Tokenizer) engineIDs(chat bool) bool {
	return !t.Estimated() && (!chat || t.exactChats())
}

// Estimated reports whether the tokenizer is the byte estimate, whose ids
// mean nothing to an engine: an engine's KV events never match its keys.
func (t *Tokenizer) Estimated() bool {
	_, est := t.src.(EstimateSource)
	return est
}

// EstimatedWarning is the warning of a model whose engines publish KV
// events while its tokenizer is the byte estimate (Estimated).
const EstimatedWarning = "kv events: this model's engines publish KV events but its tokenizer is the byte estimate, " +
	"so their blocks never match a text or chat prompt (token-id prompts and kvgate's own approximate entries still do); " +
	"give --tokenizer model=MODEL,source=engine (or source=local,file=tokenizer.json)"

// exactChats reports whether conversations are tokenized with the
// engine's own chat template now (Chat).
func (t *Tokenizer) exactChats() bool { return t.exact && !t.noMessages.Load() }

// Prompt tokenizes a completion prompt as an engine does by default,
// with the tokenizer's special tokens (PromptAs).
func (t *Tokenizer) Prompt(ctx context.Context, prompt string) ([]uint32, error) {
	return t.PromptAs(ctx, prompt, true)
}

// PromptAs tokenizes a completion prompt, with the tokenizer's special
// tokens (a BOS token) when special: vLLM's add_special_tokens, true by
// default for completions, so that a Llama-family model's prompt is keyed
// from the BOS its engine caches first. A source without special tokens
// (the estimate) tokenizes alike either way.
func (t *Tokenizer) PromptAs(ctx context.Context, prompt string, special bool) ([]uint32, error) {
	ps, ok := t.src.(PromptSource)
	f, kind := t.src.Tokenize, byte('p')
	if ok {
		f = func(ctx context.Context, text string) ([]uint32, error) { return ps.TokenizePrompt(ctx, text, special) }
		if special {
			kind = 'P'
		}
	}
	ids, err := t.cached(ctx, kind, prompt, f)
	if err != nil {
		return nil, err
	}
	return append([]uint32(nil), ids...), nil
}

// Chat tokenizes a conversation.
//
// With the engine's rendering (exact chat) the ids of every conversation
// are cached under a hash chained over its messages. Each turn of a
// growing conversation is a new conversation, so it costs one engine call
// (the engine's template sees the whole conversation; nothing else gives
// its exact ids); the cache stores it as the ids it shares with the
// longest cached earlier turn plus its own tail, so a conversation of n
// turns holds about its final length in the cache, not n copies of its
// prefix. Repeated conversations (a lookup and the routed request, a
// retry, the same few-shot prompt) cost no call.
//
// Otherwise each rendered message segment is cached, so a growing
// conversation re-tokenizes only its new messages.
func (t *Tokenizer) Chat(ctx context.Context, msgs []Message) ([]uint32, error) {
	return t.ChatAs(ctx, msgs, ChatOptions{})
}

// ChatAs is Chat with the prompt ending as opts says, with its tools and
// template kwargs (which only an exact chat renders: the engine's or the
// model's own template).
func (t *Tokenizer) ChatAs(ctx context.Context, msgs []Message, opts ChatOptions) ([]uint32, error) {
	ids, _, err := t.chatAs(ctx, msgs, opts)
	return ids, err
}

// chatAs is ChatAs; alt reports ids of opts.Alternative's rendering,
// tried when the exact rendering of msgs was refused (the engine's 4xx,
// or the model's own template raising).
func (t *Tokenizer) chatAs(ctx context.Context, msgs []Message, opts ChatOptions) (ids []uint32, alt bool, err error) {
	if t.exactChats() {
		ids, err := t.exactChat(ctx, msgs, opts)
		if err != nil && opts.Alternative != nil && refusedConversation(err) {
			if other := opts.Alternative(); other != nil {
				o := opts
				o.Alternative = nil
				if ids, err := t.exactChat(ctx, other, o); err == nil {
					t.takesMessages.Store(true)
					return ids, true, nil
				}
			}
		}
		var se *StatusError
		switch {
		case err == nil:
			t.takesMessages.Store(true)
			return ids, false, nil
		case !errors.As(err, &se) || !se.refused():
			return nil, false, err
		case t.takesConversations(ctx):
			// This conversation's own refusal (a template that refuses
			// its roles' order, tools the engine cannot read): it is
			// rendered with tmpl, and the engine answers it as it will.
			t.logger().Debug("tokens: the engine refused one conversation at /tokenize; rendering it with the configured template", "err", err)
		case !t.noMessages.Swap(true):
			t.logger().Warn("tokens: the engine refused a conversation at /tokenize; rendering chats with the configured template from now on (set exact_chat=false to choose this)",
				"template", t.tmpl.Name, "err", err)
		}
	}
	var out []uint32
	for _, seg := range t.tmpl.SegmentsAs(msgs, opts.Mode) {
		// A rendered segment without special tokens: the template wrote
		// them (Tokenize).
		ids, err := t.cached(ctx, 's', seg, t.src.Tokenize)
		if err != nil {
			return nil, false, err
		}
		out = append(out, ids...)
	}
	return out, false, nil
}

// refusedConversation reports whether err is a conversation's refusal
// rather than a failure: the engine's /tokenize refusing it, or the
// model's own template raising on it.
func refusedConversation(err error) bool {
	var se *StatusError
	return errors.As(err, &se) && se.refused() || errors.Is(err, errRender)
}

// takesConversations reports whether the engine's /tokenize takes
// conversations: it took one before, or a plain one now. Only a refusal
// of the plain one says no (a failure says nothing: asked again next
// time).
func (t *Tokenizer) takesConversations(ctx context.Context) bool {
	if t.takesMessages.Load() {
		return true
	}
	_, err := t.src.(MessagesSource).TokenizeChat(ctx, []Message{TextMessage("user", "hi")}, ChatOptions{})
	var se *StatusError
	if err == nil {
		t.takesMessages.Store(true)
	}
	return err == nil || !errors.As(err, &se) || !se.refused()
}

// minShared is the fewest ids a conversation must share with an earlier
// turn to be cached as a tail of it.
const minShared = 16

// exactChat asks the engine to render and tokenize msgs (see Chat).
func (t *Tokenizer) exactChat(ctx context.Context, msgs []Message, opts ChatOptions) ([]uint32, error) {
	ms := t.src.(MessagesSource)
	if t.cache == nil {
		return ms.TokenizeChat(ctx, msgs, opts)
	}
	keys := t.conversationKeys(msgs, opts)
	if ids, ok := t.cache.getCopy(keys[len(msgs)]); ok {
		return ids, nil
	}
	ids, err := ms.TokenizeChat(ctx, msgs, opts)
	if err != nil {
		return nil, err
	}
	t.cache.putConversation(keys[len(msgs)], ids, keys[1:len(msgs)])
	return ids, nil
}

// conversationKeys returns the cache key of every prefix of msgs rendered
// as mode says: keys[i] is msgs[:i]'s, chained so that computing all of
// them reads each message once.
func (t *Tokenizer) conversationKeys(msgs []Message, opts ChatOptions) []uint64 {
	keys := make([]uint64, len(msgs)+1)
	var b [9]byte
	binary.LittleEndian.PutUint64(b[:8], t.ns)
	b[8] = 'c' + byte(opts.Mode)
	d := xxhash.New()
	_, _ = d.Write(b[:])
	for _, raw := range []json.RawMessage{opts.Tools, opts.Kwargs} {
		binary.LittleEndian.PutUint64(b[:8], uint64(len(raw)))
		_, _ = d.Write(b[:8])
		_, _ = d.Write(raw)
	}
	keys[0] = d.Sum64()
	for i, m := range msgs {
		d.Reset()
		binary.LittleEndian.PutUint64(b[:8], keys[i])
		_, _ = d.Write(b[:8])
		_, _ = d.WriteString(m.Role)
		_, _ = d.Write([]byte{0})
		if m.object != nil { // what it renders from: its text is the object's
			_, _ = d.Write([]byte{1})
			_, _ = d.Write(m.object)
		} else {
			_, _ = d.WriteString(m.Text())
		}
		keys[i+1] = d.Sum64()
	}
	return keys
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
//
// A conversation's ids may be held as a tail of an earlier turn's entry
// (its base): touching an entry touches its bases too, so a base is never
// evicted before the entries built on it and every id is counted once.
type Cache struct {
	mu        sync.Mutex
	max       int
	size      int
	ll        *list.List
	m         map[uint64]*list.Element
	hits, mis atomic.Int64
}

type cacheEntry struct {
	key    uint64
	ids    []uint32      // all ids, or with a base the ids after the shared ones
	base   *list.Element // nil, or the entry whose first shared ids come first
	shared int
	depth  int // bases below this one
}

// maxBaseDepth bounds base chains (a lookup walks them).
const maxBaseDepth = 32

func (e *cacheEntry) len() int { return e.shared + len(e.ids) }

// appendIDs appends e's ids to dst.
func (e *cacheEntry) appendIDs(dst []uint32) []uint32 {
	if e.base != nil {
		n := len(dst)
		dst = e.base.Value.(*cacheEntry).appendIDs(dst)[:n+e.shared]
	}
	return append(dst, e.ids...)
}

// touch makes el and its bases the most recent, bases first in line.
func (c *Cache) touch(el *list.Element) {
	for ; el != nil; el = el.Value.(*cacheEntry).base {
		c.ll.MoveToFront(el)
	}
}

// NewCache returns a cache holding up to maxTokens token ids (default 4 Mi).
func NewCache(maxTokens int) *Cache {
	if maxTokens <= 0 {
		maxTokens = 4 << 20
	}
	return &Cache{max: maxTokens, ll: list.New(), m: map[uint64]*list.Element{}}
}

// get returns k's ids; the caller must not modify them.
func (c *Cache) get(k uint64) ([]uint32, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if el, ok := c.m[k]; ok {
		c.touch(el)
		c.hits.Add(1)
		e := el.Value.(*cacheEntry)
		if e.base == nil {
			return e.ids, true
		}
		return e.appendIDs(make([]uint32, 0, e.len())), true
	}
	c.mis.Add(1)
	return nil, false
}

// getCopy returns a copy of k's ids, the caller's to keep.
func (c *Cache) getCopy(k uint64) ([]uint32, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if el, ok := c.m[k]; ok {
		c.touch(el)
		c.hits.Add(1)
		e := el.Value.(*cacheEntry)
		return e.appendIDs(make([]uint32, 0, e.len())), true
	}
	c.mis.Add(1)
	return nil, false
}

// putConversation caches ids under k, as a tail of the entry of the
// latest of earlier (keys of earlier turns, oldest first) that is cached
// and shares at least minShared leading ids with them.
func (c *Cache) putConversation(k uint64, ids []uint32, earlier []uint64) {
	if len(ids) > c.max {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if el, ok := c.m[k]; ok {
		c.touch(el)
		return
	}
	e := &cacheEntry{key: k, ids: ids}
	for i := len(earlier) - 1; i >= 0; i-- {
		bel, ok := c.m[earlier[i]]
		if !ok {
			continue
		}
		b := bel.Value.(*cacheEntry)
		if b.depth >= maxBaseDepth {
			break
		}
		prev := b.appendIDs(make([]uint32, 0, b.len()))
		n := 0
		for n < len(prev) && n < len(ids) && prev[n] == ids[n] {
			n++
		}
		if n >= minShared {
			e = &cacheEntry{key: k, ids: append([]uint32(nil), ids[n:]...), base: bel, shared: n, depth: b.depth + 1}
		}
		break
	}
	el := c.ll.PushFront(e)
	c.m[k] = el
	c.size += len(e.ids)
	c.touch(el)
	c.evict()
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
	c.evict()
}

// evict drops the least recent entries until the cache fits (the least
// recent is never the base of another: see touch).
func (c *Cache) evict() {
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
	// ExactChat sends conversations to the engine's own template; nil
	// means yes for source=engine.
	ExactChat *bool
	// InlineSystem is where the model's engines put a Messages request's
	// system messages inside messages (vLLM's --anthropic-inline-system,
	// or hoist for vLLM before it kept them in place); "" is auto.
	InlineSystem openai.InlineSystem
}

// ParseSpec parses "model=m,source=engine,url=http://127.0.0.1:8001,
// template=llama3,exact_chat=true,inline_system=fold" (keys in any order;
// source=estimate takes bytes_per_token=N, source=local takes file=PATH).
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
			if err != nil || n <= 0 || n > 1024 {
				return fmt.Errorf("bad bytes_per_token %q: want 1 to 1024", v)
			}
			sp.BytesPerToken = n
		case "exact_chat":
			b, err := strconv.ParseBool(v)
			if err != nil {
				return fmt.Errorf("bad exact_chat %q", v)
			}
			sp.ExactChat = &b
		case "inline_system":
			m, err := openai.ParseInlineSystem(v)
			if err != nil {
				return err
			}
			sp.InlineSystem = m
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

// logger is the tokenizer's logger.
func (t *Tokenizer) logger() *slog.Logger {
	if t.log == nil {
		return slog.Default()
	}
	return t.log
}

// SetLogger gives every tokenizer of s its logger (the default one
// otherwise, which a command's --log-level did not reach). Call it before
// the set is used.
func (s *Set) SetLogger(l *slog.Logger) {
	for _, t := range s.byModel {
		t.log = l
	}
	if s.def != nil {
		s.def.log = l
	}
}

// NewSet builds tokenizers from specs sharing one cache. Without a default
// spec the default is the byte estimate with the default template. With
// engines (the gateway's fleet), a model's source=engine tokenizer asks
// its other engines when the configured one cannot answer, and needs no
// url= (it asks the model's engines).
func NewSet(specs []Spec, cache *Cache, client *http.Client, engines EngineFallback) (*Set, error) {
	s := &Set{byModel: map[string]*Tokenizer{}, cache: cache}
	for _, sp := range specs {
		t, err := build(sp, cache, client, engines)
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
		t, err := build(Spec{}, cache, client, nil)
		if err != nil {
			return nil, err
		}
		s.def = t
	}
	return s, nil
}

// CheckSpec checks what building sp's tokenizer would refuse, without
// building it (a local tokenizer's file is only looked for, not read): a
// config reload refuses what the next start would (until 2026-12-04 a
// reload logged success for source=nope, which a start then refused).
// withEngines: the set's models may ask their engines (NewSet's
// engines), so source=engine with model= needs no url=.
func CheckSpec(sp Spec, withEngines bool) error {
	if _, err := LookupTemplate(sp.Template); err != nil {
		return err
	}
	switch sp.Source {
	case "", "estimate":
	case "engine":
		named := sp.Model != "" && sp.Model != "*"
		if sp.URL == "" && (!withEngines || !named) {
			if withEngines {
				return fmt.Errorf("tokens: source=engine without model= needs url=")
			}
			return fmt.Errorf("tokens: model %q: source=engine needs url=", sp.Model)
		}
		if u, err := url.Parse(sp.URL); sp.URL != "" && (err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "") {
			return fmt.Errorf("tokens: model %q: url=%q is not an engine's address: want http://HOST:PORT", sp.Model, sp.URL)
		} else if sp.URL != "" && (strings.HasSuffix(strings.TrimRight(u.Path, "/"), "/v1") || u.RawQuery != "" || u.Fragment != "") {
			// An OpenAI base URL (…/v1) is what clients are given; vLLM
			// serves /tokenize at its root, so …/v1/tokenize was a 404 on
			// every lookup, taken for the engine refusing chats. (A path
			// prefix of a proxy in front of the engine is kept.)
			return fmt.Errorf("tokens: model %q: url=%q: give the engine's address, http://HOST:PORT, not its OpenAI base URL (vLLM serves /tokenize at its root, not under /v1)", sp.Model, sp.URL)
		}
	case "local":
		if sp.File == "" {
			return fmt.Errorf("tokens: model %q: source=local needs file=", sp.Model)
		}
		if _, err := os.Stat(sp.File); err != nil {
			return fmt.Errorf("tokens: model %q: %w", sp.Model, err)
		}
	default:
		return fmt.Errorf("tokens: model %q: unknown source %q (estimate, engine, local)", sp.Model, sp.Source)
	}
	return nil
}

func build(sp Spec, cache *Cache, client *http.Client, engines EngineFallback) (*Tokenizer, error) {
	if err := CheckSpec(sp, engines != nil); err != nil {
		return nil, err
	}
	tmpl, err := LookupTemplate(sp.Template)
	if err != nil {
		return nil, err
	}
	var src Source
	exact := sp.Source == "engine" // the engine renders its own chats by default
	if sp.ExactChat != nil {
		exact = *sp.ExactChat
	}
	switch sp.Source {
	case "", "estimate":
		src = EstimateSource{BytesPerToken: sp.BytesPerToken}
	case "engine":
		named := sp.Model != "" && sp.Model != "*"
		es := &EngineSource{BaseURL: sp.URL, Model: sp.Model, Client: client}
		if named {
			es.Others = engines
		}
		src = es
	case "local":
		ls, own, err := loadLocalSpec(sp, cache)
		if err != nil {
			return nil, err
		}
		src, exact = ls, own // the file's own chat template, unless template= overrides
	}
	ns := fmt.Sprintf("%q|%q|%q|%q|%d|%q|%v", sp.Model, sp.Source, sp.URL, sp.File, sp.BytesPerToken, sp.Template, exact)
	t := NewTokenizer(src, tmpl, cache, exact, ns)
	t.inline = sp.InlineSystem
	return t, nil
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
