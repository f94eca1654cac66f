// Package strata is what an application needs to be a member of a group:
// a Channel, the options that build it, the Receiver that gets what it
// delivers, and the messages, addresses, views and errors those speak.
//
// New builds a channel on a stack config: a shipped one (Shipped), a file
// (FromFile, FromFS) or protocols built in Go (FromProtocols); with none,
// the default stack, udp.toml. A program registers the protocols a config
// names by importing them, usually all at once:
//
//	import _ "github.com/strata-go/strata/protocols/all"
//
// Connect joins a cluster and returns with the first view; Send sends a
// message to one member or, with a zero destination, to the group. The
// Receiver gets the messages and, in order with them, each new view;
// Blocker and StateHandler add the flush notices and state transfer.
//
// The names here are package stack's, under the same names (type aliases,
// and functions that call stack's): a Channel here is a stack.Channel, so
// it goes wherever one is asked for (rpc.New, groupfc.Of, diag). Package
// stack is for protocol authors, building blocks above the channel and
// tests: layers, events, headers, the wire codec, the registry, and
// stack.Of, which hands over a channel's stack to insert a layer at run
// time. A Channel itself exposes no part of the stack's lifecycle.
package strata

import (
	"io/fs"
	"log/slog"

	"github.com/strata-go/strata/stack"
)

// Channel is a member of a group: Connect, Send, Disconnect, Close, its
// address and view, flushes and state transfer (see stack.Channel).
type Channel = stack.Channel

// Option configures New: where the stack comes from and the channel's
// name, receiver, logger, seed and diagnostics.
type Option = stack.Option

// New builds a channel, ready to Connect. Without a stack option it runs
// the default stack, udp.toml (UDP with IP multicast on 127.0.0.1, or on
// STRATA_BIND_ADDR).
func New(opts ...Option) (*Channel, error) { return stack.New(opts...) }

// Shipped takes one of the stacks shipped in package configs ("udp.toml",
// "flush.toml", "groupfc.toml", "secure.toml", "sim.toml"...), embedded in
// the program.
func Shipped(name string) Option { return stack.Shipped(name) }

// FromFile takes the stack from a TOML stack config file.
func FromFile(path string) Option { return stack.FromFile(path) }

// FromFS takes the stack from the TOML stack config at path in fsys.
func FromFS(fsys fs.FS, path string) Option { return stack.FromFS(fsys, path) }

// FromProtocols takes the stack from protocols built in Go with their
// packages' constructors (sim.New, gms.New...), transport first.
func FromProtocols(protos ...stack.Protocol) Option { return stack.FromProtocols(protos...) }

// WithVars gives a config's ${NAME} variables values that take precedence
// over the environment.
func WithVars(vars map[string]string) Option { return stack.WithVars(vars) }

// WithName sets the member's logical name, shown in views and logs.
func WithName(name string) Option { return stack.WithName(name) }

// WithReceiver sets the receiver before anything can be delivered.
func WithReceiver(r Receiver) Option { return stack.WithReceiver(r) }

// WithLogger sets the logger of the channel and its protocols.
func WithLogger(l *slog.Logger) Option { return stack.WithLogger(l) }

// WithSeed seeds the stack's random choices and the member's addresses, so
// that a run on the in-memory network in virtual time can be replayed.
func WithSeed(seed uint64) Option { return stack.WithSeed(seed) }

// WithDiag serves the channel's metrics, JSON snapshot and pprof over HTTP
// at addr ("" turns off a config's diag_addr); the program imports
// package diag.
func WithDiag(addr string) Option { return stack.WithDiag(addr) }

// Receiver gets the messages a channel delivers (Receive) and each new view
// in order with them (ViewAccepted).
type Receiver = stack.Receiver

// ReceiverFuncs adapts two functions to a Receiver.
type ReceiverFuncs = stack.ReceiverFuncs

// Blocker is implemented by a receiver that wants to know when a flush
// blocks and unblocks the group's multicasts.
type Blocker = stack.Blocker

// StateHandler is implemented by a receiver that provides and accepts the
// application's state (GetState, ConnectWithState).
type StateHandler = stack.StateHandler

// BatchReceiver is implemented by a receiver that takes the messages of one
// sender and lane whole, as a Batch.
type BatchReceiver = stack.BatchReceiver

// Batch is the messages of one sender on one lane, handed to a
// BatchReceiver in one call.
type Batch = stack.Batch

// Message is what a channel sends and delivers: a destination (zero: the
// group), the sender, flags and a payload.
type Message = stack.Message

// NewMessage returns a message with payload for dest (zero: the group).
func NewMessage(dest Address, payload []byte) *Message { return stack.NewMessage(dest, payload) }

// Slab makes payloads and messages for a goroutine that sends many small
// ones, a block at a time instead of one allocation each.
type Slab = stack.Slab

// Flags change how the stack carries a message (Message.Set).
type Flags = stack.Flags

// The message flags an application sets.
const (
	// OOB: delivered as soon as it arrives, not ordered behind the
	// sender's other messages (still reliable).
	OOB = stack.OOB
	// DontBundle: sent at once rather than bundled with others.
	DontBundle = stack.DontBundle
	// NoFC: passes flow control without credits.
	NoFC = stack.NoFC
	// NoReliability: not retransmitted or ordered by the reliable layers.
	NoReliability = stack.NoReliability
)

// Address is a member's address; the zero Address means the whole group.
type Address = stack.Address

// View is the ordered membership of the group at one time; the first
// member coordinates.
type View = stack.View

// ViewID names a view: its creator and a number that grows with every
// view change.
type ViewID = stack.ViewID

// ProtocolStats are one protocol's counters, as Channel.Stats returns them.
type ProtocolStats = stack.ProtocolStats

// Stat is one counter or gauge in ProtocolStats.
type Stat = stack.Stat

// ConfigError is a stack config problem, placed by file, line, protocol and
// key; New returns one for a bad config.
type ConfigError = stack.ConfigError

// Errors a channel returns, for errors.Is.
var (
	// ErrClosed: the channel is closed.
	ErrClosed = stack.ErrClosed
	// ErrNotConnected: the channel is not connected to a cluster.
	ErrNotConnected = stack.ErrNotConnected
	// ErrNotSupported: the stack has no layer for the call (GetState
	// without STATE_TRANSFER).
	ErrNotSupported = stack.ErrNotSupported
	// ErrWouldDeadlock: a call from a callback that would wait for that
	// callback's own return.
	ErrWouldDeadlock = stack.ErrWouldDeadlock
	// ErrAuthFailed: the group refused this member's proof of the group
	// secret (AUTH), returned by Connect.
	ErrAuthFailed = stack.ErrAuthFailed
)
