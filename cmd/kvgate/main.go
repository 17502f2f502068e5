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
	}
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
	}
	cmd, ok := commands()[args[0]]
	if !ok {
		fmt.Fprintf(stderr, "kvgate: unknown command %q\n\n", args[0])
		usage(stderr)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := cmd.run(ctx, args[1:], stdout, stderr); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		fmt.Fprintf(stderr, "kvgate %s: %v\n", args[0], err)
		return 1
	}
	return 0
}

// parseFlags parses a command's flags, refuses positional arguments and
// checks every ranged number.
func parseFlags(fs *flag.FlagSet, fl *flagrange.Flags, args []string) error {
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	return fl.Check()
}
