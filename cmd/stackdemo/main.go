// Command stackdemo is strata's command-line tool: it validates stack
// configs and lists the protocols a config can use.
//
//	stackdemo validate [FILE]   print the stack FILE builds (default: the embedded default)
//	stackdemo protocols         list every protocol with its keys, types, defaults and docs
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
	case "help", "-h", "-help", "--help":
		usage(stdout)
		return exitOK
	}
	fmt.Fprintf(stderr, "stackdemo: unknown command %q\n", args[0])
	usage(stderr)
	return exitConfig
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
