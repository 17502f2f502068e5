package engine

import (
	"strings"
	"unicode"
	"unicode/utf8"
)

// The emulator's tokenizer is deliberately simple and deterministic:
//
//   - text is split into runs of letters and digits ("words") and single
//     other non-space characters (punctuation, symbols); white space only
//     separates tokens and produces none;
//   - words longer than maxWordBytes bytes are cut into pieces of that size,
//     so long identifiers cost several tokens as with a BPE;
//   - each piece maps to id = firstTokenID + FNV-1a-32(piece) mod vocabSize.
//
// The same function serves POST /tokenize and the engine's own requests, so
// a router that tokenizes through /tokenize sees exactly the engine's ids.
const (
	vocabSize    = 150000
	firstTokenID = 100 // ids below are reserved for special tokens
	maxWordBytes = 12
)

func tokenID(piece string) uint32 {
	const offset, prime = 2166136261, 16777619
	h := uint32(offset)
	for i := 0; i < len(piece); i++ {
		h ^= uint32(piece[i])
		h *= prime
	}
	return firstTokenID + h%vocabSize
}

func isWordRune(r rune) bool { return unicode.IsLetter(r) || unicode.IsDigit(r) || r == '_' }

// asciiClass classifies ASCII bytes: 0 other, 1 space, 2 word.
var asciiClass = func() (c [utf8.RuneSelf]uint8) {
	for b := range c {
		switch r := rune(b); {
		case unicode.IsSpace(r):
			c[b] = 1
		case isWordRune(r):
			c[b] = 2
		}
	}
	return c
}()

// appendTokens appends the token ids of text to dst.
func appendTokens(dst []uint32, text string) []uint32 {
	i := 0
	for i < len(text) {
		if c := text[i]; c < utf8.RuneSelf && asciiClass[c] != 2 {
			// Fast path for ASCII space and punctuation.
			if asciiClass[c] == 0 {
				dst = append(dst, tokenID(text[i:i+1]))
			}
			i++
			continue
		}
		r, size := utf8.DecodeRuneInString(text[i:])
		switch {
		case unicode.IsSpace(r):
			i += size
		case isWordRune(r):
			j := i + size
			for j < len(text) {
				if c := text[j]; c < utf8.RuneSelf {
					if asciiClass[c] != 2 {
						break
					}
					j++
					continue
				}
				r2, s2 := utf8.DecodeRuneInString(text[j:])
				if !isWordRune(r2) {
					break
				}
				j += s2
			}
			word := text[i:j]
			for len(word) > maxWordBytes {
				cut := maxWordBytes
				for cut > 0 && !utf8.RuneStart(word[cut]) {
					cut--
				}
				if cut == 0 {
					cut = maxWordBytes
				}
				dst = append(dst, tokenID(word[:cut]))
				word = word[cut:]
			}
			dst = append(dst, tokenID(word))
			i = j
		default:
			dst = append(dst, tokenID(text[i:i+size]))
			i += size
		}
	}
	return dst
}

// Tokenize returns the token ids of text under the emulator's tokenizer.
func Tokenize(text string) []uint32 { return appendTokens(make([]uint32, 0, len(text)/4+1), text) }

// ChatMessage is one message of a chat request, its content already
// flattened to text.
type ChatMessage struct {
	Role    string
	Content string
}

// chatEnd ends each message of the emulator's chat template.
const chatEnd = "<|im_end|>\n"

// RenderChat renders messages with the emulator's chat template:
//
//	<|im_start|>ROLE
//	CONTENT<|im_end|>
//
// for each message, then "<|im_start|>assistant\n" when addGenerationPrompt
// (the default of the OpenAI chat API).
func RenderChat(msgs []ChatMessage, addGenerationPrompt bool) string {
	var b strings.Builder
	for _, m := range msgs {
		b.WriteString("<|im_start|>")
		b.WriteString(m.Role)
		b.WriteByte('\n')
		b.WriteString(m.Content)
		b.WriteString(chatEnd)
	}
	if addGenerationPrompt {
		b.WriteString("<|im_start|>assistant\n")
	}
	return b.String()
}

// fillerWords are the emulator's output vocabulary; output token i of a
// request is fillerWords[(seed+i) % len]. Words only, so the text of an
// answer tokenizes back to the same ids.
var fillerWords = [...]string{
	"lorem", "ipsum", "dolor", "sit", "amet", "consectetur", "adipiscing", "elit",
	"sed", "do", "eiusmod", "tempor", "incididunt", "ut", "labore", "et",
	"dolore", "magna", "aliqua", "enim", "ad", "minim", "veniam", "quis",
	"nostrud", "exercitation", "ullamco", "laboris", "nisi", "aliquip", "ex", "ea",
}

// fillerIDs holds tokenID(fillerWords[i]); computed once, never mutated.
var fillerIDs = func() [len(fillerWords)]uint32 {
	var ids [len(fillerWords)]uint32
	for i, w := range fillerWords {
		ids[i] = tokenID(w)
	}
	return ids
}()

func fillerIndex(seed uint32, i int) int { return int((seed + uint32(i)) % uint32(len(fillerWords))) }

// outputText is the text of output tokens [from, to) of rq.
func outputText(b *strings.Builder, rq *request, from, to int) {
	for i := from; i < to; i++ {
		if rq.spaceBefore(i) {
			b.WriteByte(' ')
		}
		b.WriteString(fillerWords[fillerIndex(rq.seed, i)])
	}
}
