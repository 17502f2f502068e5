package tokens

import (
	"errors"
	"fmt"
	"regexp"
	"strings"
	"sync"
	"unicode"
	"unicode/utf8"

	"golang.org/x/text/unicode/norm"
)

// A splitter is one pre-tokenizer step: it cuts a piece of text into
// smaller pieces, in order, covering it.
type splitter interface {
	split(s string, emit func(string))
}

// The split patterns of Llama 3 and of Qwen 2/2.5/3 (the same but for the
// digit groups), recognised so they run on a hand-written scanner.
const (
	llama3Pattern = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
	qwenPattern   = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
	// gpt2Pattern is what a ByteLevel pre-tokenizer with use_regex splits on.
	gpt2Pattern = `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`
)

// wsLookaheadSuffix ends most byte-level split patterns. Go's regexp has
// no lookahead, so regexSplit implements these two alternatives itself.
const wsLookaheadSuffix = `\s+(?!\S)|\s+`

// Character classes of the scanner. \s is Unicode White_Space (what
// Oniguruma, which tokenizers uses, means by \s); newline is \r or \n.
const (
	clsOther = iota
	clsLetter
	clsNumber
	clsSpace
	clsNewline
)

// runeClass classifies a rune the slow way.
func runeClass(r rune) uint8 {
	switch {
	case r == '\r' || r == '\n':
		return clsNewline
	case unicode.IsLetter(r):
		return clsLetter
	case unicode.IsNumber(r):
		return clsNumber
	case unicode.IsSpace(r):
		return clsSpace
	}
	return clsOther
}

// bmpClasses is the class of every rune of the Basic Multilingual Plane,
// built on first use (64 KiB), for the scanner's inner loop.
var bmpClasses = sync.OnceValue(func() *[1 << 16]uint8 {
	var t [1 << 16]uint8
	for r := range t {
		t[r] = runeClass(rune(r))
	}
	return &t
})

// nfcStable is a bitset over the Basic Multilingual Plane of the runes
// that NFC leaves alone whatever surrounds them: in NFC on their own,
// canonical combining class 0, and never composing with a preceding rune.
// A text of such runes only is in NFC. Built on first use (8 KiB).
var nfcStable = sync.OnceValue(func() *[1 << 16 / 64]uint64 {
	var t [1 << 16 / 64]uint64
	for r := rune(0); r < 1<<16; r++ {
		if r >= 0xD800 && r < 0xE000 {
			continue // surrogates are not runes
		}
		s := string(r)
		p := norm.NFC.PropertiesString(s)
		if norm.NFC.IsNormalString(s) && p.CCC() == 0 && p.BoundaryBefore() {
			t[r/64] |= 1 << (r % 64)
		}
	}
	return &t
})

// nfc is norm.NFC.String, run only over the islands that need it. A
// stable rune has a normalization boundary before it, so an island runs
// from the stable rune before an unstable one (it may compose with it) to
// the next stable rune, and the rest of the text is copied as it is.
func nfc(s string) string {
	stable := nfcStable()
	isStable := func(r rune) bool { return r < 1<<16 && stable[r/64]&(1<<(r%64)) != 0 }
	var b strings.Builder
	used := false   // b holds s[:done], normalized
	done := 0       // s[:done] is in b (when used)
	lastStart := -1 // start of the last stable rune since done, or -1
	for i := 0; i < len(s); {
		r, n := rune(s[i]), 1
		if r >= utf8.RuneSelf {
			r, n = utf8.DecodeRuneInString(s[i:])
		}
		if isStable(r) {
			lastStart = i
			i += n
			continue
		}
		start := done
		if lastStart >= 0 {
			start = lastStart
		}
		end := i + n
		for end < len(s) {
			r2, n2 := rune(s[end]), 1
			if r2 >= utf8.RuneSelf {
				r2, n2 = utf8.DecodeRuneInString(s[end:])
			}
			if isStable(r2) {
				break
			}
			end += n2
		}
		if !used {
			used = true
			b.Grow(len(s) + 8)
		}
		b.WriteString(s[done:start])
		b.WriteString(norm.NFC.String(s[start:end]))
		done, lastStart, i = end, -1, end
	}
	if !used {
		return s
	}
	b.WriteString(s[done:])
	return b.String()
}

// classAt returns the class and the byte length of the rune at s[i]. An
// invalid byte is a one-byte "other" (U+FFFD's class).
func classAt(s string, i int) (uint8, int) {
	r, n := rune(s[i]), 1
	if r >= utf8.RuneSelf {
		r, n = utf8.DecodeRuneInString(s[i:])
	}
	return runeClass(r), n
}

// llamaSplit is the split on llama3Pattern (maxDigits 3) or qwenPattern
// (maxDigits 1), written out by hand: the alternatives are tried in order
// at each position, as a backtracking regex engine does, and the pieces
// are the matches (the pattern matches at every position, so there are no
// gaps).
type llamaSplit struct {
	maxDigits int
	cls       *[1 << 16]uint8 // bmpClasses()
}

func newLlamaSplit(maxDigits int) llamaSplit {
	return llamaSplit{maxDigits: maxDigits, cls: bmpClasses()}
}

// classAt is the package's classAt with the table.
func (sp llamaSplit) classAt(s string, i int) (uint8, int) {
	if b := s[i]; b < utf8.RuneSelf {
		return sp.cls[b], 1
	}
	r, n := utf8.DecodeRuneInString(s[i:])
	if r < 1<<16 {
		return sp.cls[r], n
	}
	return runeClass(r), n
}

func (sp llamaSplit) split(s string, emit func(string)) {
	for i := 0; i < len(s); {
		j := sp.next(s, i)
		emit(s[i:j])
		i = j
	}
}

// next returns the end of the match starting at s[i].
func (sp llamaSplit) next(s string, i int) int {
	c, n := sp.classAt(s, i)
	switch c {
	case clsLetter: // [^\r\n\p{L}\p{N}]?\p{L}+ without the optional char
		return sp.runOf(s, i+n, clsLetter)
	case clsNumber: // \p{N}{1,maxDigits}
		j := i + n
		for k := 1; k < sp.maxDigits && j < len(s); k++ {
			c2, n2 := sp.classAt(s, j)
			if c2 != clsNumber {
				break
			}
			j += n2
		}
		return j
	case clsNewline:
		return sp.spaceMatch(s, i)
	}
	// c is clsOther or clsSpace.
	if s[i] == '\'' {
		if j := contraction(s, i+1); j > 0 {
			return j
		}
	}
	if i+n < len(s) {
		c2, n2 := sp.classAt(s, i+n)
		if c2 == clsLetter { // [^\r\n\p{L}\p{N}]\p{L}+
			return sp.runOf(s, i+n+n2, clsLetter)
		}
		if s[i] == ' ' && c2 == clsOther { // " [^\s\p{L}\p{N}]+[\r\n]*"
			return newlines(s, sp.runOf(s, i+n+n2, clsOther))
		}
	}
	if c == clsOther { // [^\s\p{L}\p{N}]+[\r\n]*
		return newlines(s, sp.runOf(s, i+n, clsOther))
	}
	return sp.spaceMatch(s, i)
}

// runOf returns the end of the run of class c starting at s[j].
func (sp llamaSplit) runOf(s string, j int, c uint8) int {
	for j < len(s) {
		c2, n := sp.classAt(s, j)
		if c2 != c {
			break
		}
		j += n
	}
	return j
}

// newlines returns the end of the run of \r and \n starting at s[j].
func newlines(s string, j int) int {
	for j < len(s) && (s[j] == '\r' || s[j] == '\n') {
		j++
	}
	return j
}

// contraction matches (?i:s|t|re|ve|m|ll|d) at s[j] (after an
// apostrophe) and returns its end, or 0. Case-insensitive matching folds
// U+017F (long s) to s, as Unicode case folding does.
func contraction(s string, j int) int {
	if j >= len(s) {
		return 0
	}
	switch s[j] {
	case 's', 'S', 't', 'T', 'm', 'M', 'd', 'D':
		return j + 1
	case 'r', 'R', 'v', 'V':
		if j+1 < len(s) && s[j+1]|0x20 == 'e' {
			return j + 2
		}
	case 'l', 'L':
		if j+1 < len(s) && s[j+1]|0x20 == 'l' {
			return j + 2
		}
	case 0xC5: // U+017F is C5 BF
		if j+1 < len(s) && s[j+1] == 0xBF {
			return j + 2
		}
	}
	return 0
}

// spaceMatch is the match of \s*[\r\n]+|\s+(?!\S)|\s+ at s[i] (a
// whitespace rune): up to the last newline of the whitespace run if it
// has one; else the whole run if it ends the text or is one rune long;
// else the run but its last rune (which a following word takes).
func (sp llamaSplit) spaceMatch(s string, i int) int {
	j, lastNL, last, runes := i, -1, i, 0
	for j < len(s) {
		c, n := sp.classAt(s, j)
		if c != clsSpace && c != clsNewline {
			break
		}
		if c == clsNewline {
			lastNL = j + n
		}
		last = j
		j += n
		runes++
	}
	if lastNL >= 0 {
		return lastNL
	}
	return wsLookahead(s, j, last, runes)
}

// wsLookahead resolves \s+(?!\S)|\s+ for a whitespace run of runes runes
// ending at s[j], whose last rune starts at last: the match ends there.
func wsLookahead(s string, j, last, runes int) int {
	if j == len(s) || runes == 1 {
		return j
	}
	return last
}

// whitespaceClass is Unicode White_Space, Oniguruma's \s, as class items.
const whitespaceClass = `\t\n\v\f\r \x{85}\x{A0}\x{1680}\x{2000}-\x{200A}\x{2028}\x{2029}\x{202F}\x{205F}\x{3000}`

// regexSplit is a Split pre-tokenizer (behaviour "Isolated") on any
// pattern Go's regexp can run once translated from Oniguruma's syntax.
// A pattern ending in the alternatives \s+(?!\S)|\s+ has them cut off
// (ws) and resolved by hand after re finds no match at a whitespace rune.
type regexSplit struct {
	re *regexp.Regexp // nil: the pattern was only the whitespace suffix
	ws bool
}

func newRegexSplit(pattern string) (*regexSplit, error) {
	sp := &regexSplit{}
	p := pattern
	if p == wsLookaheadSuffix {
		sp.ws, p = true, ""
	} else if strings.HasSuffix(p, "|"+wsLookaheadSuffix) && topLevelAlt(p, len(p)-len(wsLookaheadSuffix)-1) {
		sp.ws, p = true, strings.TrimSuffix(p, "|"+wsLookaheadSuffix)
	}
	if p == "" {
		return sp, nil
	}
	goPat, err := translateOniguruma(p)
	if err != nil {
		return nil, fmt.Errorf("tokens: split pattern %q: %w", pattern, err)
	}
	re, err := regexp.Compile(goPat)
	if err != nil {
		return nil, fmt.Errorf("tokens: split pattern %q: %w", pattern, err)
	}
	if re.MatchString("") {
		return nil, fmt.Errorf("tokens: split pattern %q matches the empty string (unsupported)", pattern)
	}
	sp.re = re
	return sp, nil
}

func (sp *regexSplit) split(s string, emit func(string)) {
	ms, me := -1, -1 // the next regex match at or after p, if known
	for p := 0; p < len(s); {
		if ms < p {
			ms, me = len(s), len(s)
			if sp.re != nil {
				if loc := sp.re.FindStringIndex(s[p:]); loc != nil {
					ms, me = p+loc[0], p+loc[1]
				}
			}
		}
		if sp.ws {
			if w := indexSpace(s[p:ms]); w >= 0 {
				w += p
				if w > p {
					emit(s[p:w])
				}
				end := wsRunMatch(s, w)
				emit(s[w:end])
				p = end
				continue
			}
		}
		if ms > p {
			emit(s[p:ms])
		}
		if me > ms {
			emit(s[ms:me])
		}
		p = me
	}
}

// indexSpace returns the index of the first whitespace rune in s or -1.
func indexSpace(s string) int {
	for i := 0; i < len(s); {
		c, n := classAt(s, i)
		if c == clsSpace || c == clsNewline {
			return i
		}
		i += n
	}
	return -1
}

// wsRunMatch is the match of \s+(?!\S)|\s+ at s[i] (a whitespace rune).
func wsRunMatch(s string, i int) int {
	j, last, runes := i, i, 0
	for j < len(s) {
		c, n := classAt(s, j)
		if c != clsSpace && c != clsNewline {
			break
		}
		last = j
		j += n
		runes++
	}
	return wsLookahead(s, j, last, runes)
}

// topLevelAlt reports whether p[at] is a '|' outside any group or class.
func topLevelAlt(p string, at int) bool {
	depth, inClass := 0, false
	for i := 0; i < at; i++ {
		switch c := p[i]; {
		case c == '\\':
			i++
		case inClass:
			if c == ']' {
				inClass = false
			}
		case c == '[':
			inClass = true
			if i+1 < len(p) && p[i+1] == ']' {
				i++ // "[]...]": the first ] is literal
			} else if i+2 < len(p) && p[i+1] == '^' && p[i+2] == ']' {
				i += 2
			}
		case c == '(':
			depth++
		case c == ')':
			depth--
		}
	}
	return at < len(p) && p[at] == '|' && depth == 0 && !inClass
}

// translateOniguruma rewrites the Oniguruma syntax tokenizers patterns use
// into Go's: \s, \d, \w and their negations get Oniguruma's Unicode
// meaning, \uXXXX becomes \x{XXXX}; lookaround, anchors, \b, \G and
// backreferences, which Go cannot run or which would change meaning when
// matching from the middle of a text, are refused.
func translateOniguruma(p string) (string, error) {
	var b strings.Builder
	inClass := false
	for i := 0; i < len(p); i++ {
		c := p[i]
		switch {
		case c == '\\' && i+1 < len(p):
			i++
			e := p[i]
			switch e {
			case 's':
				if inClass {
					b.WriteString(whitespaceClass)
				} else {
					b.WriteString("[" + whitespaceClass + "]")
				}
			case 'S':
				if inClass {
					return "", errors.New(`\S inside a character class is not supported`)
				}
				b.WriteString("[^" + whitespaceClass + "]")
			case 'd':
				b.WriteString(`\p{Nd}`)
			case 'D':
				b.WriteString(`\P{Nd}`)
			case 'w', 'W':
				items := `\p{L}\p{M}\p{Nd}\p{Pc}`
				switch {
				case e == 'w' && inClass:
					b.WriteString(items)
				case e == 'w':
					b.WriteString("[" + items + "]")
				case inClass:
					return "", errors.New(`\W inside a character class is not supported`)
				default:
					b.WriteString("[^" + items + "]")
				}
			case 'u':
				if i+4 >= len(p) {
					return "", errors.New(`bad \u escape`)
				}
				b.WriteString(`\x{` + p[i+1:i+5] + `}`)
				i += 4
			case 'b', 'B', 'A', 'z', 'Z', 'G', 'K', 'h', 'H', 'R', 'X', 'k', 'g', '1', '2', '3', '4', '5', '6', '7', '8', '9':
				return "", fmt.Errorf(`\%c is not supported`, e)
			default:
				b.WriteByte('\\')
				b.WriteByte(e)
			}
		case inClass:
			if c == ']' {
				inClass = false
			}
			b.WriteByte(c)
		case c == '[':
			inClass = true
			b.WriteByte(c)
			for _, lit := range []string{"^]", "]"} { // a leading ] is literal
				if strings.HasPrefix(p[i+1:], lit) {
					b.WriteString(lit)
					i += len(lit)
					break
				}
			}
		case c == '(' && hasAnyPrefix(p[i:], "(?=", "(?!", "(?<=", "(?<!", "(?>"):
			return "", errors.New("lookaround and atomic groups are not supported")
		case c == '^' || c == '$':
			return "", errors.New("anchors are not supported")
		default:
			b.WriteByte(c)
		}
	}
	return b.String(), nil
}

func hasAnyPrefix(s string, prefixes ...string) bool {
	for _, p := range prefixes {
		if strings.HasPrefix(s, p) {
			return true
		}
	}
	return false
}

// prefixSpace is ByteLevel's add_prefix_space: a piece that does not start
// with a space gets one.
type prefixSpace struct{}

func (prefixSpace) split(s string, emit func(string)) {
	if s == "" || s[0] == ' ' {
		emit(s)
		return
	}
	emit(" " + s)
}

// pipeline runs splitters one after another over a text.
type pipeline []splitter

func (pl pipeline) run(s string, emit func(string)) {
	switch len(pl) {
	case 0:
		emit(s)
	case 1:
		pl[0].split(s, emit)
	default:
		rest := pl[1:]
		pl[0].split(s, func(p string) { rest.run(p, emit) })
	}
}
