package main

import (
	"fmt"
	"io"
	"log/slog"
)

// textLogger is a slog text logger on w at the named level (debug, info,
// warn or error); callers name the flag in the error.
func textLogger(w io.Writer, level string) (*slog.Logger, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("%q is not a level: use debug, info, warn or error", level)
	}
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: l})), nil
}
