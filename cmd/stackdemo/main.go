// Command stackdemo is strata's command-line tool: it validates stack
// configs, lists the protocols a config can use, and measures a stack.
//
//	stackdemo validate [FILE]   print the stack FILE builds (default: the embedded default)
//	stackdemo protocols         list every protocol with its keys, types, defaults and docs
//	stackdemo chat [flags]      a chat member: lines from stdin to the group, the group's lines and views to stdout
//	stackdemo perf [flags]      throughput and latency of a stack, checked for loss and order
//	stackdemo probe ADDR...     members' views, coordinators and differing counters, from their -diag endpoints
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"strings"
	"text/tabwriter"

	"github.com/strata-go/strata/configs"
	_ "github.com/strata-go/strata/diag" // serves -diag and diag_addr
	_ "github.com/strata-go/strata/protocols/all"
	"github.com/strata-go/strata/stack"
)

// Exit codes.
const (
	exitOK     = 0
	exitFail   = 1
	exitConfig = 2
)

func main() { os.Exit(run(os.Args[1:], os.Stdout, os.Stderr)) }

func usage(w io.Writer) {
	fmt.Fprintf(w, `usage: stackdemo <command> [arguments]

commands:
  validate [FILE]   check a stack config and print the stack it builds, one
                    protocol per line with the values that differ from the
                    defaults (default FILE: the embedded configs/%s)
  protocols         list every registered protocol with its keys
  chat [flags]      a chat member: -name, -cluster, -config FILE; multicasts
                    each line read from stdin, prints what others send and
                    every view; leaves on end of input or Ctrl-C; -diag ADDR
                    serves metrics, /debug/strata and pprof there
  perf [flags]      throughput or latency test: -members N in this process on
                    loopback, -mode multicast|unicast|anycast|rpc, -size,
                    -count, -senders, -oob, -json, -config FILE, -diag ADDR
                    (member i on port+i); with -join
                    each process is one member (run -members N of them); fails
                    (exit 1) on any lost, duplicated or reordered message
  probe ADDR...     ask members' diagnostics endpoints (chat and perf serve
                    one with -diag ADDR) and print side by side each one's
                    view (LAGS: it missed a view), coordinator and the
                    counters that differ; -json, -watch (every second, with
                    the change per second), -all (every counter)

exit status: 0 ok, 1 failure, 2 config or usage error
`, configs.Default)
}

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		usage(stderr)
		return exitConfig
	}
	switch args[0] {
	case "validate":
		return cmdValidate(args[1:], stdout, stderr)
	case "protocols":
		return cmdProtocols(stdout)
	case "perf":
		return cmdPerf(args[1:], stdout, stderr)
	case "chat":
		return cmdChat(args[1:], os.Stdin, stdout, stderr)
	case "probe":
		return cmdProbe(args[1:], stdout, stderr)
	case "help", "-h", "-help", "--help":
		usage(stdout)
		return exitOK
	}
	fmt.Fprintf(stderr, "stackdemo: unknown command %q\n", args[0])
	usage(stderr)
	return exitConfig
}

// readConfig returns the bytes of path, or of the embedded default when
// path is empty, and the name to use in errors.
func readConfig(path string) ([]byte, string, error) {
	if path == "" {
		data, err := fs.ReadFile(configs.FS, configs.Default)
		return data, "configs/" + configs.Default + " (embedded)", err
	}
	data, err := os.ReadFile(path)
	return data, path, err
}

// loadConfig reads path, or the embedded default when path is empty.
func loadConfig(path string) (*stack.StackConfig, error) {
	if path == "" {
		data, err := fs.ReadFile(configs.FS, configs.Default)
		if err != nil {
			return nil, err
		}
		return stack.ParseConfig("configs/"+configs.Default+" (embedded)", data)
	}
	return stack.LoadConfig(path)
}

func cmdValidate(args []string, stdout, stderr io.Writer) int {
	fl := flag.NewFlagSet("validate", flag.ContinueOnError)
	fl.SetOutput(stderr)
	if err := fl.Parse(args); err != nil {
		return exitConfig
	}
	if fl.NArg() > 1 {
		fmt.Fprintln(stderr, "stackdemo validate: at most one FILE")
		return exitConfig
	}
	sc, err := loadConfig(fl.Arg(0))
	if err != nil {
		fmt.Fprintln(stderr, err)
		var ce *stack.ConfigError
		if errors.As(err, &ce) {
			return exitConfig
		}
		return exitFail
	}
	fmt.Fprintf(stdout, "%s: %d protocols, bottom first\n", sc.File, len(sc.Protocols))
	if sc.DiagAddr != "" {
		fmt.Fprintf(stdout, "diagnostics on %s\n", sc.DiagAddr)
	}
	for i, pc := range sc.Protocols {
		var kv []string
		for _, s := range pc.Changed() {
			kv = append(kv, s.Key+"="+s.Value)
		}
		fmt.Fprintf(stdout, "%2d  %-14s %s\n", i+1, pc.Type.Name, strings.Join(kv, " "))
	}
	return exitOK
}

func cmdProtocols(stdout io.Writer) int {
	for _, t := range stack.Registered() {
		kind := ""
		if t.Transport {
			kind = " (transport)"
		}
		fmt.Fprintf(stdout, "%s%s, id %d: %s\n", t.Name, kind, t.ID, t.Doc)
		tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
		for _, k := range t.Keys {
			fmt.Fprintf(tw, "    %s\t%s\t= %s\t%s\n", k.Key, k.Type, k.Default, k.Doc)
		}
		tw.Flush()
		fmt.Fprintln(stdout)
	}
	return exitOK
}
