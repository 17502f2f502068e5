package kvevents

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
)

// reader is a minimal, allocation-free msgpack reader over one payload. It
// reads only what the KV-event decoder needs and validates every length
// against the bytes that remain, so hostile input cannot make it allocate
// or recurse without bound.
type reader struct {
	b []byte
	i int
}

var errShort = errors.New("msgpack: unexpected end of data")

const maxSkipDepth = 32

// kind classes returned by peekKind.
const (
	mpNil = iota
	mpBool
	mpInt
	mpFloat
	mpStr
	mpBin
	mpArray
	mpMap
	mpExt
	mpInvalid
)

func (r *reader) done() bool { return r.i >= len(r.b) }

func (r *reader) peekKind() (int, error) {
	if r.i >= len(r.b) {
		return mpInvalid, errShort
	}
	c := r.b[r.i]
	switch {
	case c <= 0x7f || c >= 0xe0:
		return mpInt, nil
	case c >= 0x80 && c <= 0x8f:
		return mpMap, nil
	case c >= 0x90 && c <= 0x9f:
		return mpArray, nil
	case c >= 0xa0 && c <= 0xbf:
		return mpStr, nil
	}
	switch c {
	case 0xc0:
		return mpNil, nil
	case 0xc2, 0xc3:
		return mpBool, nil
	case 0xc4, 0xc5, 0xc6:
		return mpBin, nil
	case 0xc7, 0xc8, 0xc9, 0xd4, 0xd5, 0xd6, 0xd7, 0xd8:
		return mpExt, nil
	case 0xca, 0xcb:
		return mpFloat, nil
	case 0xcc, 0xcd, 0xce, 0xcf, 0xd0, 0xd1, 0xd2, 0xd3:
		return mpInt, nil
	case 0xd9, 0xda, 0xdb:
		return mpStr, nil
	case 0xdc, 0xdd:
		return mpArray, nil
	case 0xde, 0xdf:
		return mpMap, nil
	}
	return mpInvalid, fmt.Errorf("msgpack: invalid type byte 0x%02x at %d", c, r.i)
}

func (r *reader) need(n int) error {
	if n < 0 || len(r.b)-r.i < n {
		return errShort
	}
	return nil
}

func (r *reader) u8() (byte, error) {
	if r.i >= len(r.b) {
		return 0, errShort
	}
	c := r.b[r.i]
	r.i++
	return c, nil
}

func (r *reader) be(n int) (uint64, error) {
	if err := r.need(n); err != nil {
		return 0, err
	}
	var v uint64
	for _, c := range r.b[r.i : r.i+n] {
		v = v<<8 | uint64(c)
	}
	r.i += n
	return v, nil
}

// isNil consumes a nil if one is next.
func (r *reader) isNil() bool {
	if r.i < len(r.b) && r.b[r.i] == 0xc0 {
		r.i++
		return true
	}
	return false
}

// intRaw reads any msgpack integer. neg reports a negative signed value;
// v then holds its two's-complement bits.
func (r *reader) intRaw() (v uint64, neg bool, err error) {
	c, err := r.u8()
	if err != nil {
		return 0, false, err
	}
	switch {
	case c <= 0x7f:
		return uint64(c), false, nil
	case c >= 0xe0:
		return uint64(int64(int8(c))), true, nil
	}
	switch c {
	case 0xcc:
		v, err = r.be(1)
	case 0xcd:
		v, err = r.be(2)
	case 0xce:
		v, err = r.be(4)
	case 0xcf:
		v, err = r.be(8)
	case 0xd0:
		v, err = r.be(1)
		v = uint64(int64(int8(v)))
	case 0xd1:
		v, err = r.be(2)
		v = uint64(int64(int16(v)))
	case 0xd2:
		v, err = r.be(4)
		v = uint64(int64(int32(v)))
	case 0xd3:
		v, err = r.be(8)
	default:
		r.i--
		return 0, false, fmt.Errorf("msgpack: expected integer, got 0x%02x at %d", c, r.i)
	}
	if err != nil {
		return 0, false, err
	}
	if c >= 0xd0 {
		neg = int64(v) < 0
	}
	return v, neg, nil
}

// int reads an integer that must fit in int64.
func (r *reader) int() (int64, error) {
	v, neg, err := r.intRaw()
	if err != nil {
		return 0, err
	}
	if !neg && v > math.MaxInt64 {
		return 0, fmt.Errorf("msgpack: integer %d overflows int64", v)
	}
	return int64(v), nil
}

// float reads a float32/float64, or an integer as a float.
func (r *reader) float() (float64, error) {
	if r.i >= len(r.b) {
		return 0, errShort
	}
	switch r.b[r.i] {
	case 0xca:
		r.i++
		v, err := r.be(4)
		return float64(math.Float32frombits(uint32(v))), err
	case 0xcb:
		r.i++
		v, err := r.be(8)
		return math.Float64frombits(v), err
	}
	v, err := r.int()
	return float64(v), err
}

// rawLen reads the header of a str or bin and returns its payload.
func (r *reader) bytesOrStr() ([]byte, error) {
	c, err := r.u8()
	if err != nil {
		return nil, err
	}
	var n uint64
	switch {
	case c >= 0xa0 && c <= 0xbf:
		n = uint64(c & 0x1f)
	case c == 0xc4 || c == 0xd9:
		n, err = r.be(1)
	case c == 0xc5 || c == 0xda:
		n, err = r.be(2)
	case c == 0xc6 || c == 0xdb:
		n, err = r.be(4)
	default:
		r.i--
		return nil, fmt.Errorf("msgpack: expected str or bin, got 0x%02x at %d", c, r.i)
	}
	if err != nil {
		return nil, err
	}
	if n > uint64(len(r.b)-r.i) {
		return nil, errShort
	}
	s := r.b[r.i : r.i+int(n)]
	r.i += int(n)
	return s, nil
}

// arrayLen reads an array header. The length is checked against the bytes
// left (every element takes at least one byte).
func (r *reader) arrayLen() (int, error) {
	c, err := r.u8()
	if err != nil {
		return 0, err
	}
	var n uint64
	switch {
	case c >= 0x90 && c <= 0x9f:
		n = uint64(c & 0x0f)
	case c == 0xdc:
		n, err = r.be(2)
	case c == 0xdd:
		n, err = r.be(4)
	default:
		r.i--
		return 0, fmt.Errorf("msgpack: expected array, got 0x%02x at %d", c, r.i)
	}
	if err != nil {
		return 0, err
	}
	if n > uint64(len(r.b)-r.i) {
		return 0, errShort
	}
	return int(n), nil
}

// mapLen reads a map header (each entry takes at least two bytes).
func (r *reader) mapLen() (int, error) {
	c, err := r.u8()
	if err != nil {
		return 0, err
	}
	var n uint64
	switch {
	case c >= 0x80 && c <= 0x8f:
		n = uint64(c & 0x0f)
	case c == 0xde:
		n, err = r.be(2)
	case c == 0xdf:
		n, err = r.be(4)
	default:
		r.i--
		return 0, fmt.Errorf("msgpack: expected map, got 0x%02x at %d", c, r.i)
	}
	if err != nil {
		return 0, err
	}
	if n > uint64(len(r.b)-r.i)/2 {
		return 0, errShort
	}
	return int(n), nil
}

// skipScalar skips a one-byte value (nil, bool, fixint) if one is next.
func (r *reader) skipScalar() bool {
	if r.i < len(r.b) {
		if c := r.b[r.i]; c <= 0x7f || c >= 0xe0 || c == 0xc0 || c == 0xc2 || c == 0xc3 {
			r.i++
			return true
		}
	}
	return false
}

// str reads a str or bin like bytesOrStr, with a fast path for the short
// strings (fixstr) that name fields and event types.
func (r *reader) str() ([]byte, error) {
	if r.i < len(r.b) {
		if c := r.b[r.i]; c&0xe0 == 0xa0 {
			n := int(c & 0x1f)
			if j := r.i + 1 + n; j <= len(r.b) {
				s := r.b[r.i+1 : j]
				r.i = j
				return s, nil
			}
		}
	}
	return r.bytesOrStr()
}

// skip skips one value of any type.
func (r *reader) skip() error { return r.skipDepth(0) }

func (r *reader) skipDepth(depth int) error {
	if depth > maxSkipDepth {
		return errors.New("msgpack: nesting too deep")
	}
	if r.skipScalar() {
		return nil
	}
	k, err := r.peekKind()
	if err != nil {
		return err
	}
	switch k {
	case mpNil, mpBool:
		r.i++
		return nil
	case mpInt:
		_, _, err = r.intRaw()
		return err
	case mpFloat:
		_, err = r.float()
		return err
	case mpStr, mpBin:
		_, err = r.bytesOrStr()
		return err
	case mpArray:
		n, err := r.arrayLen()
		if err != nil {
			return err
		}
		for j := 0; j < n; j++ {
			if r.skipScalar() { // a list of nils (extra_keys): no call
				continue
			}
			if err := r.skipDepth(depth + 1); err != nil {
				return err
			}
		}
		return nil
	case mpMap:
		n, err := r.mapLen()
		if err != nil {
			return err
		}
		for j := 0; j < 2*n; j++ {
			if err := r.skipDepth(depth + 1); err != nil {
				return err
			}
		}
		return nil
	case mpExt:
		c := r.b[r.i]
		r.i++
		var n uint64
		switch c {
		case 0xd4:
			n = 1
		case 0xd5:
			n = 2
		case 0xd6:
			n = 4
		case 0xd7:
			n = 8
		case 0xd8:
			n = 16
		case 0xc7:
			n, err = r.be(1)
		case 0xc8:
			n, err = r.be(2)
		case 0xc9:
			n, err = r.be(4)
		}
		if err != nil {
			return err
		}
		n++ // type byte
		if n > uint64(len(r.b)-r.i) {
			return errShort
		}
		r.i += int(n)
		return nil
	}
	return fmt.Errorf("msgpack: cannot skip type at %d", r.i)
}

// hash reads a block hash: any integer width (negative values keep their
// two's-complement bits) or bytes, of which the last 8 are taken big-endian
// (shorter byte strings are zero-extended on the left).
func (r *reader) hash() (uint64, error) {
	k, err := r.peekKind()
	if err != nil {
		return 0, err
	}
	switch k {
	case mpInt:
		v, _, err := r.intRaw()
		return v, err
	case mpBin, mpStr:
		s, err := r.bytesOrStr()
		if err != nil {
			return 0, err
		}
		if len(s) >= 8 {
			return binary.BigEndian.Uint64(s[len(s)-8:]), nil
		}
		var v uint64
		for _, c := range s {
			v = v<<8 | uint64(c)
		}
		return v, nil
	}
	return 0, fmt.Errorf("msgpack: block hash must be an integer or bytes (at %d)", r.i)
}
