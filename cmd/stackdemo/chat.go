package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sync"
	"syscall"

	"github.com/strata-go/strata/stack"
)

// chatPrinter prints what a chat member receives and every view.
type chatPrinter struct {
	mu  sync.Mutex
	out io.Writer
}

func (p *chatPrinter) Receive(m *stack.Message) {
	p.mu.Lock()
	defer p.mu.Unlock()
	fmt.Fprintf(p.out, "%s: %s\n", m.Src, m.Payload)
}

func (p *chatPrinter) ViewAccepted(v *stack.View) {
	p.mu.Lock()
	defer p.mu.Unlock()
	fmt.Fprintf(p.out, "** view %s\n", v)
}

func cmdChat(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	fl := flag.NewFlagSet("chat", flag.ContinueOnError)
	fl.SetOutput(stderr)
	config := fl.String("config", "", "stack config FILE (default: the embedded default)")
	name := fl.String("name", "", "this member's name (default: host-pid)")
	cluster := fl.String("cluster", "chat", "the group to join")
	diagAddr := fl.String("diag", "", "serve diagnostics (metrics, /debug/strata, pprof) on host:port, for stackdemo probe (default: the config's diag_addr, off)")
	if err := fl.Parse(args); err != nil {
		return exitConfig
	}
	if *name == "" {
		h, _ := os.Hostname()
		*name = fmt.Sprintf("%s-%d", h, os.Getpid())
	}
	data, file, err := readConfig(*config)
	if err != nil {
		fmt.Fprintln(stderr, "stackdemo chat:", err)
		return exitConfig
	}
	sc, err := stack.ParseConfigVars(file, data, nil)
	if err != nil {
		fmt.Fprintln(stderr, err)
		return exitConfig
	}
	pr := &chatPrinter{out: stdout}
	ch, err := stack.New(withDiag(*diagAddr, stack.FromConfig(sc), stack.WithName(*name), stack.WithReceiver(pr))...)
	if err != nil {
		fmt.Fprintln(stderr, "stackdemo chat:", err)
		return exitFail
	}
	defer ch.Close()
	printDiag(stderr, ch)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := ch.Connect(ctx, *cluster); err != nil {
		fmt.Fprintln(stderr, "stackdemo chat:", err)
		return exitFail
	}
	lines := make(chan string)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(stdin)
		for sc.Scan() {
			select {
			case lines <- sc.Text():
			case <-ctx.Done():
				return
			}
		}
	}()
	for {
		select {
		case l, ok := <-lines:
			if !ok {
				return leave(ch, stderr)
			}
			if l == "" {
				continue
			}
			if err := ch.Send(ctx, stack.NewMessage(stack.Address{}, []byte(l))); err != nil {
				fmt.Fprintln(stderr, "stackdemo chat: send:", err)
			}
		case <-ctx.Done():
			return leave(ch, stderr)
		}
	}
}

func leave(ch *stack.Channel, stderr io.Writer) int {
	if err := ch.Disconnect(context.Background()); err != nil {
		fmt.Fprintln(stderr, "stackdemo chat: leave:", err)
		return exitFail
	}
	return exitOK
}
