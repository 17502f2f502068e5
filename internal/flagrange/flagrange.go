// Package flagrange gives every number that reaches kvgate through a flag or a
// configuration struct a finite range, checked in one place, with an error
// that names the setting and the range:
//
//	--duration must be in [0.001, 86400] seconds, got 1e+12
//
// A Range is a plain value: a package declares the ranges of its settings,
// its Validate method checks them with Check, and a command registers the
// same ranges as flags with Var and checks them all with Flags.Check after
// parsing, so the library and the command line cannot disagree.
package flagrange

import (
	"errors"
	"flag"
	"fmt"
	"math"
	"strconv"
	"time"
)

// Number is what a Range bounds: integers, floats and time.Duration.
type Number interface {
	~int | ~int64 | ~float64
}

// Range is the closed interval [Min, Max]. Unit ("seconds", "tokens") is
// shown after the interval in messages. When Zero is set, 0 is accepted as
// well and means what Zero says ("none", "free"): such a range reads
// "0 (none) or in [0.001, 86400] seconds". NaN is never in a range, and
// neither is an infinity, since Min and Max are finite.
type Range[T Number] struct {
	Min, Max T
	Unit     string
	Zero     string
}

// Contains reports whether v is in the range.
func (r Range[T]) Contains(v T) bool {
	if v == 0 && r.Zero != "" {
		return true
	}
	return v >= r.Min && v <= r.Max // false for NaN
}

// String is the range as messages and flag usages show it.
func (r Range[T]) String() string {
	s := fmt.Sprintf("in [%v, %v]", r.Min, r.Max)
	if r.Unit != "" {
		s += " " + r.Unit
	}
	if r.Zero != "" {
		s = "0 (" + r.Zero + ") or " + s
	}
	return s
}

// Check returns nil when v is in the range and otherwise an error naming the
// setting ("--duration" on a command line, "duration" in a config).
func (r Range[T]) Check(name string, v T) error {
	if r.Contains(v) {
		return nil
	}
	return &Error{Name: name, Range: r.String(), Got: fmt.Sprint(v)}
}

// Error is a value outside its range.
type Error struct {
	Name  string // the setting
	Range string // as Range.String
	Got   string // the value, or the text that did not parse
}

func (e *Error) Error() string {
	return fmt.Sprintf("%s must be %s, got %s", e.Name, e.Range, e.Got)
}

// Flags collects the range checks of a flag set's bounded flags.
type Flags struct {
	fs     *flag.FlagSet
	checks []func() error
}

// New returns a Flags that registers bounded flags on fs.
func New(fs *flag.FlagSet) *Flags { return &Flags{fs: fs} }

// Var defines the flag --name on f's flag set, stored in *p, whose default is
// the current *p. The usage gets the range appended. Parsing only checks the
// syntax (an integer flag accepts 2e9 as well as 2000000000); Check tests
// the ranges of every flag once all are parsed.
func Var[T Number](f *Flags, p *T, name string, r Range[T], usage string) {
	f.fs.Var(&value[T]{p: p, r: r}, name, usage+" ("+r.String()+")")
	f.checks = append(f.checks, func() error { return r.Check("--"+name, *p) })
}

// Check tests every flag registered with Var (defaults included) and
// returns the errors of those out of range, in registration order.
func (f *Flags) Check() error {
	var errs []error
	for _, c := range f.checks {
		if err := c(); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// value is the flag.Value of one bounded flag.
type value[T Number] struct {
	p *T
	r Range[T]
}

func (v *value[T]) String() string {
	if v == nil || v.p == nil {
		return ""
	}
	if d, ok := any(*v.p).(time.Duration); ok {
		return d.String()
	}
	return fmt.Sprint(*v.p)
}

func (v *value[T]) Set(s string) error {
	x, err := parse[T](s)
	if err != nil {
		if _, ok := any(x).(time.Duration); ok {
			return fmt.Errorf("want a duration with its unit (1.5s, 300ms, 2m) %s", v.r)
		}
		return fmt.Errorf("want a number %s", v.r)
	}
	*v.p = x
	return nil
}

// parse reads s as a T: a Go duration for time.Duration, a float for
// floats, and for integers an integer or an integral float such as 2e9.
func parse[T Number](s string) (T, error) {
	var zero T
	if _, ok := any(zero).(time.Duration); ok {
		d, err := time.ParseDuration(s)
		return T(d), err
	}
	if T(1)/2 != 0 { // a float type
		f, err := strconv.ParseFloat(s, 64)
		return T(f), err
	}
	if i, err := strconv.ParseInt(s, 0, strconv.IntSize); err == nil {
		return T(i), nil
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil {
		return zero, err
	}
	if f != math.Trunc(f) || f < math.MinInt64 || f >= math.MaxInt64 {
		return zero, errors.New("not an integer in range")
	}
	return T(int64(f)), nil
}
