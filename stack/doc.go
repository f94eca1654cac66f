// Package stack is strata's core: the channel an application embeds, the
// protocol stack beneath it, and what protocol writers build layers with.
//
// # For applications
//
// A Channel is a member of a group. New builds one: on the default stack
// (udp.toml), a shipped one (Shipped("flush.toml"); they are in package
// configs), a config file (FromFile) or protocols built in Go
// (FromProtocols); import _ ".../protocols/all" to register the shipped
// protocols. Give it a Receiver (WithReceiver), Connect to a cluster
// name, then Send messages to a member or to the group (a zero
// destination). Receive gets messages; ViewAccepted gets each new view of
// the group, in order with the messages (virtual synchrony with FLUSH in
// the stack). Callbacks never run under a protocol's lock; a callback may
// send.
//
//	ch, err := stack.New(stack.Shipped("udp.toml"), stack.WithReceiver(r))
//	...
//	err = ch.Connect(ctx, "my-group")
//	err = ch.Send(ctx, stack.NewMessage(stack.Address{}, []byte("hello")))
//
// Message flags choose the lane a message travels on: OOB messages are
// not ordered behind others, INTERNAL is for protocols' own traffic.
// GetState and ConnectWithState move the application's state (with
// STATE_TRANSFER); StartFlush and StopFlush block the group (with FLUSH).
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
