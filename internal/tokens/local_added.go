package tokens

import (
	"sort"
	"strings"
	"unicode"
	"unicode/utf8"
)

// addedToken is one entry of tokenizer.json's added_tokens: text that is
// cut out before the model sees the rest and becomes one id.
type addedToken struct {
	ID         uint32 `json:"id"`
	Content    string `json:"content"`
	SingleWord bool   `json:"single_word"`
	LStrip     bool   `json:"lstrip"`
	RStrip     bool   `json:"rstrip"`
	Normalized bool   `json:"normalized"`
	Special    bool   `json:"special"`
}

// addedMatcher finds added tokens in text the way tokenizers does: the
// leftmost match, the longest one there; a single_word token that touches
// a word character is skipped; lstrip/rstrip take the whitespace beside
// the match into it.
type addedMatcher struct {
	byContent map[string]int // content → index in toks
	lens      []int          // distinct content lengths, longest first
	first     [256]bool      // first bytes of contents
	only      int            // the one first byte of all contents, or -1
	second    []uint64       // bitset over the first two bytes of contents of 2+ bytes
	toks      []addedToken
}

func newAddedMatcher(toks []addedToken) *addedMatcher {
	if len(toks) == 0 {
		return nil
	}
	m := &addedMatcher{byContent: map[string]int{}, second: make([]uint64, 1<<16/64)}
	seen := map[int]bool{}
	for _, t := range toks {
		if t.Content == "" {
			continue
		}
		if _, dup := m.byContent[t.Content]; dup {
			continue
		}
		m.byContent[t.Content] = len(m.toks)
		m.toks = append(m.toks, t)
		m.first[t.Content[0]] = true
		if len(t.Content) >= 2 {
			k := int(t.Content[0])<<8 | int(t.Content[1])
			m.second[k/64] |= 1 << (k % 64)
		}
		if !seen[len(t.Content)] {
			seen[len(t.Content)] = true
			m.lens = append(m.lens, len(t.Content))
		}
	}
	if len(m.toks) == 0 {
		return nil
	}
	sort.Sort(sort.Reverse(sort.IntSlice(m.lens)))
	m.only = int(m.toks[0].Content[0])
	for _, t := range m.toks {
		if int(t.Content[0]) != m.only {
			m.only = -1
		}
	}
	return m
}

// split calls text for every stretch of s between added tokens and added
// for every added token, in order.
func (m *addedMatcher) split(s string, text func(string), added func(addedToken)) {
	if m == nil {
		if s != "" {
			text(s)
		}
		return
	}
	done := 0 // s[:done] has been passed on
	for i := 0; i < len(s); {
		if i = m.candidate(s, i); i < 0 {
			break
		}
		k, end := m.matchAt(s, i)
		if k < 0 {
			i++
			continue
		}
		t := m.toks[k]
		if t.SingleWord && (endsWithWord(s[:i]) || startsWithWord(s[end:])) {
			i = end // tokenizers discards the match and goes on after it
			continue
		}
		start := i
		if t.LStrip {
			start = max(done, spaceRunStart(s[:i]))
		}
		if t.RStrip {
			end += spaceRunLen(s[end:])
		}
		if done < start {
			text(s[done:start])
		}
		added(t)
		done, i = end, end
	}
	if done < len(s) {
		text(s[done:])
	}
}

// candidate returns the first index from i on where an added token may
// start, or -1.
func (m *addedMatcher) candidate(s string, i int) int {
	if m.only >= 0 {
		j := strings.IndexByte(s[i:], byte(m.only))
		if j < 0 {
			return -1
		}
		return i + j
	}
	for ; i < len(s); i++ {
		if m.first[s[i]] {
			return i
		}
	}
	return -1
}

// matchAt returns the longest added token at s[i:] (index, end) or -1;
// s[i] is a candidate.
func (m *addedMatcher) matchAt(s string, i int) (int, int) {
	if i+1 < len(s) {
		k := int(s[i])<<8 | int(s[i+1])
		if m.second[k/64]&(1<<(k%64)) == 0 && !m.hasLen1(s[i]) {
			return -1, 0
		}
	}
	for _, l := range m.lens {
		if i+l > len(s) {
			continue
		}
		if k, ok := m.byContent[s[i:i+l]]; ok {
			return k, i + l
		}
	}
	return -1, 0
}

func (m *addedMatcher) hasLen1(b byte) bool {
	_, ok := m.byContent[string([]byte{b})]
	return ok
}

// isWordRune approximates the regex class \w of Rust's regex crate
// (alphabetic, marks, decimal digits, connector punctuation, joiners).
func isWordRune(r rune) bool {
	return unicode.IsLetter(r) || unicode.IsMark(r) || unicode.Is(unicode.Nd, r) || unicode.Is(unicode.Nl, r) ||
		unicode.Is(unicode.Pc, r) || r == 0x200C || r == 0x200D
}

func endsWithWord(s string) bool {
	r, n := utf8.DecodeLastRuneInString(s)
	return n > 0 && isWordRune(r)
}

func startsWithWord(s string) bool {
	r, n := utf8.DecodeRuneInString(s)
	return n > 0 && isWordRune(r)
}

// spaceRunStart is where the whitespace at the end of s begins.
func spaceRunStart(s string) int {
	i := len(s)
	for i > 0 {
		r, n := utf8.DecodeLastRuneInString(s[:i])
		if !unicode.IsSpace(r) {
			break
		}
		i -= n
	}
	return i
}

// spaceRunLen is the length of the whitespace at the start of s.
func spaceRunLen(s string) int {
	i := 0
	for i < len(s) {
		r, n := utf8.DecodeRuneInString(s[i:])
		if !unicode.IsSpace(r) {
			break
		}
		i += n
	}
	return i
}
