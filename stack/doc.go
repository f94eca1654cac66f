// Package stack is strata's core: the channel, the protocol stack beneath
// it, and what protocol writers build layers with.
//
// # For applications: package strata
//
// An application imports the module's root package, strata: New and its
// options, Channel, Receiver, Message, Address, View and the errors. They
// are this package's types under the same names (type aliases), so a
// channel made there is a *Channel here. A Channel does not hand out its
// stack: the stack's lifecycle (Start, Stop, the local address, raw
// events) is the channel's business.
//
// # For building blocks and tests
//
// Of(ch) returns a channel's stack, for code that works beside the
// layers: finding one (Find, Stack.Find), inserting one at run time
// (InsertBelow, InsertAbove: tests place fault injectors, package rpc its
// dispatcher), asking the stack (Ask) and injecting a view (InstallView).
//
// # For protocol writers
//
// A protocol is a type that embeds Base and overrides what it handles:
// Down and Up (one message), UpBatch (a batch from one sender), DownEvent
// and UpEvent (control events: one struct type per event, EvViewChange,
// EvSuspect..., handled in a type switch), Start and Stop. A query
// (EvGetDigest, EvFindMembers...) embeds Answers[R]: the layer that knows
// answers it with Reply, and the layer that wants it asks with Ask or
// AskUp, which return an R, so the two cannot disagree on its type. Register
// makes it available to stack configs, with its config struct, its
// services (what it provides and needs around it), and a header type with
// RegisterHeader. Base forwards everything else, so a layer sees only what
// concerns it. Layers share what they must through this package (Digest,
// EvReconcile, MemberInfo, MembershipHeader, Flusher, StateTransferer),
// never by importing one another. Package stacktest builds small stacks on
// the in-memory network SIM for tests in virtual time (testing/synctest).
//
// # The wire
//
// Messages travel in bundles (EncodeBundle, DecodeBundle). Headers encode
// themselves with package wire's Append functions (and this package's for
// its types: AppendAddress, AppendViewID, AppendDigest...) and decode with a
// wire.Reader, which records the first error instead of panicking, so
// malformed input is counted and dropped.
package stack
