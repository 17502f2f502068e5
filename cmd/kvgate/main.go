// Command kvgate is a global scheduler for LLM inference fleets: a gateway,
// a fleet simulator, an engine emulator and their tools in one binary.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime/debug"
	"sort"
	"syscall"

	"github.com/kvgate/kvgate/internal/flagrange"
)

// command is one subcommand: it parses its own flags from args and writes
// its output to stdout.
type command struct {
	summary string
	run     func(ctx context.Context, args []string, stdout, stderr io.Writer) error
}

func commands() map[string]command {
	return map[string]command{
		"sim":     {"simulate a fleet under a workload and compare routing policies", runSim},
		"engine":  {"run a vLLM-compatible engine emulator (HTTP API, metrics, KV events)", runEngine},
		"kvindex": {"run the KV-event subscriber, global prefix index and its admin API", runKVIndex},
		"serve":   {"run the gateway: route and proxy OpenAI requests to a fleet of engines", runServe},
		"demo":    {"the built-in comparison: an emulated fleet behind kvgate, several policies, one table and an HTML report", runDemo},
		"bench":   {"send a workload to an OpenAI-compatible server and report latencies, attainment and goodput", runBench},
		"plan":    {"size the prefill/decode split per load phase and simulate a planned day", runPlan},
		"version": {"print kvgate's version (module version, commit, Go)", runVersion},
	}
}

// runVersion prints the build's version: the module's (a tagged `go
// install` gives its tag; a checkout "(devel)"), its commit and time as
// Go recorded them, and the Go toolchain.
func runVersion(_ context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("kvgate version", flag.ContinueOnError)
	fs.SetOutput(stderr)
	if err := parseFlags(fs, flagrange.New(fs), args); err != nil {
		return err
	}
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return errors.New("no build information in this binary")
	}
	v := "kvgate " + bi.Main.Version
	settings := map[string]string{}
	for _, s := range bi.Settings {
		settings[s.Key] = s.Value
	}
	if rev := settings["vcs.revision"]; rev != "" {
		v += " " + rev[:min(len(rev), 12)]
		if settings["vcs.modified"] == "true" {
			v += "+modified"
		}
		if t := settings["vcs.time"]; t != "" {
			v += " " + t
		}
	}
	fmt.Fprintln(stdout, v, bi.GoVersion)
	return nil
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "kvgate: a KV-cache- and SLO-aware global scheduler for LLM inference fleets")
	fmt.Fprintln(w, "\nUsage: kvgate <command> [flags]   (kvgate <command> -h for its flags)")
	fmt.Fprintln(w, "\nCommands:")
	cmds := commands()
	names := make([]string, 0, len(cmds))
	for n := range cmds {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintf(w, "  %-10s %s\n", n, cmds[n].summary)
	}
	fmt.Fprintln(w, "\nStart here: kvgate demo   (or kvgate sim --scenario seed-routing)")
}

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	switch {
	case len(args) == 0: // no command: the usage, as an error (git and go do so)
		usage(stderr)
		return 2
	case len(args) >= 2 && args[0] == "help": // "kvgate help sim" is "kvgate sim -h"
		args = []string{args[1], "-h"}
	case args[0] == "-h" || args[0] == "--help" || args[0] == "help":
		usage(stdout)
		return 0
	case args[0] == "--version" || args[0] == "-version":
		args = []string{"version"}
	}
	cmd, ok := commands()[args[0]]
	if !ok {
		fmt.Fprintf(stderr, "kvgate: unknown command %q\n\n", args[0])
		usage(stderr)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	err := cmd.run(ctx, args[1:], stdout, stderr)
	var ue *usageError
	switch {
	case err == nil:
		return 0
	case errors.Is(err, flag.ErrHelp):
		return 0
	case errors.As(err, &ue):
		// A usage error exits 2, as Go's flag package and git do; one
		// the flag package told already (above its usage) is not
		// told again.
		if !ue.told {
			fmt.Fprintf(stderr, "kvgate %s: %v\n", args[0], err)
		}
		return 2
	}
	fmt.Fprintf(stderr, "kvgate %s: %v\n", args[0], err)
	return 1
}

// usageError is a command line the command cannot run: an unknown flag,
// a bad value, an unexpected argument. told: the flag package printed it.
type usageError struct {
	err  error
	told bool
}

func (e *usageError) Error() string { return e.err.Error() }
func (e *usageError) Unwrap() error { return e.err }

// parseFlags parses a command's flags, refuses positional arguments and
// checks every ranged number; what it refuses is a usageError.
func parseFlags(fs *flag.FlagSet, fl *flagrange.Flags, args []string) error {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return &usageError{err: err, told: true}
	}
	if fs.NArg() > 0 {
		return &usageError{err: fmt.Errorf("unexpected arguments %q", fs.Args())}
	}
	if err := fl.Check(); err != nil {
		return &usageError{err: err}
	}
	return nil
}
