package stack

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"sync"
	"sync/atomic"
)

// Receiver gets what a channel delivers. Receive runs on the stack's
// delivery goroutines, concurrently for different senders (and for OOB
// messages), so it must be safe for concurrent use; one that blocks holds up
// that sender's regular messages, nothing else (a view waits for the Receive
// calls before it for at most a second, then goes; that sender's messages
// queued behind the blocked one come after it). ViewAccepted (and Block and
// Unblock, see Blocker) run one at a time, in order, on the channel's
// callback goroutine: the membership protocol does not wait for them, so a
// view callback that blocks holds back only this member's later callbacks
// and its deliveries (a message reaches Receive after the ViewAccepted of
// every view installed before it has returned), never the group.
//
// A callback may call anything on the channel: Send (which may wait for
// flow control, as anywhere), StartFlush and StopFlush, GetState,
// Disconnect and Close. Disconnect and Close from a callback leave the group
// and return; the stack's goroutines end once the callback has returned.
//
// Received messages are read-only (a member's own are the ones it sent,
// which may still be on their way out): Copy one to change it.
type Receiver interface {
	Receive(m *Message)
	ViewAccepted(v *View)
}

// BatchReceiver is implemented by receivers that take batches whole.
type BatchReceiver interface {
	ReceiveBatch(b *Batch)
}

// Blocker is implemented by receivers that want to know when a flush blocks
// and unblocks the group's sends. Both are notices, delivered in order with
// the views on the channel's callback goroutine: the flush does not wait for
// them (multicasts wait at FLUSH's gate whatever Block does), so they may
// block or start a flush.
type Blocker interface {
	Block()
	Unblock()
}

// StateHandler is implemented by receivers that provide and accept
// application state (state transfer to joiners).
type StateHandler interface {
	GetState(w io.Writer) error
	SetState(r io.Reader) error
}

// ReceiverFuncs adapts functions to Receiver; nil functions are skipped.
type ReceiverFuncs struct {
	OnReceive func(m *Message)
	OnView    func(v *View)
}

// Receive calls OnReceive.
func (f ReceiverFuncs) Receive(m *Message) {
	if f.OnReceive != nil {
		f.OnReceive(m)
	}
}

// ViewAccepted calls OnView.
func (f ReceiverFuncs) ViewAccepted(v *View) {
	if f.OnView != nil {
		f.OnView(v)
	}
}

type chanState int

const (
	chOpen chanState = iota
	chConnecting
	chConnected
	// chLeaving: a connect that failed after joining is leaving the group
	// and stopping the stack (without c.mu: a view being installed
	// meanwhile takes it, and the leave waits for that).
	chLeaving
	chClosed
)

// Channel is what an application embeds: a stack, a member address and a
// receiver. Create it, Connect to a cluster, Send, and Close.
type Channel struct {
	st   *Stack
	name string

	mu        sync.Mutex
	state     chanState
	connected atomic.Bool
	recv      atomic.Pointer[receiverBox]
	view      atomic.Pointer[View]
	everConn  bool

	cb *callbacks
	// stops counts the stack stops a callback's Disconnect or Close left to
	// finish after it returns, and that of a failed connect; Connect,
	// Disconnect and Close wait for them.
	stops    sync.WaitGroup
	stopping atomic.Int32
	inState  atomic.Int32 // GetState or SetState callbacks running
	diag     DiagServer   // nil without diag_addr; set by New, closed by Close
}

type receiverBox struct{ r Receiver }

func (c *Channel) newAddress() {
	a := c.st.Rand().address()
	if c.name != "" {
		SetLogicalName(a, c.name)
	}
	c.st.SetLocalAddress(a)
}

// Of returns ch's stack, for protocol authors, building blocks above the
// channel (rpc, diag) and tests: finding a layer, inserting one at run
// time, injecting a view. The stack's lifecycle is the channel's; an
// application has no need of it, so Channel does not hand it out.
func Of(ch *Channel) *Stack { return ch.st }

// Address returns the member's current address (new after each reconnect).
func (c *Channel) Address() Address { return c.st.LocalAddress() }

// Name returns the logical name given with WithName.
func (c *Channel) Name() string { return c.name }

// Cluster returns the cluster name of the current connection.
func (c *Channel) Cluster() string { return c.st.Cluster() }

// View returns the current view, or nil when not connected.
func (c *Channel) View() *View { return c.view.Load() }

// SetReceiver sets (or, with nil, removes) the receiver.
func (c *Channel) SetReceiver(r Receiver) {
	if r == nil {
		c.recv.Store(nil)
		return
	}
	c.recv.Store(&receiverBox{r})
}

func (c *Channel) receiver() Receiver {
	if b := c.recv.Load(); b != nil {
		return b.r
	}
	return nil
}

// Connect joins cluster: it starts the stack and returns once the member has
// its first view (a view of itself alone if no membership protocol is in the
// stack), or when ctx ends.
func (c *Channel) Connect(ctx context.Context, cluster string) error {
	return c.connect(ctx, cluster, EvConnect{Cluster: cluster})
}

// ConnectWithState joins cluster and fetches the application state from
// member from (zero: the coordinator) into the receiver's SetState. With
// FLUSH in the stack both happen in the one flush round that installs this
// member's view, so no message is sent between the state and the first
// delivery. The first member of a group has no state to fetch. If the state
// cannot be fetched, the member leaves again and the error says why.
func (c *Channel) ConnectWithState(ctx context.Context, cluster string, from Address) error {
	if _, ok := Find[StateTransferer](c.st); !ok {
		return fmt.Errorf("strata: ConnectWithState: %w: no state transfer layer (STATE_TRANSFER) in the stack", ErrNotSupported)
	}
	if _, ok := c.receiver().(StateHandler); !ok {
		return fmt.Errorf("strata: ConnectWithState: the receiver must implement StateHandler (GetState and SetState)")
	}
	if err := c.connect(ctx, cluster, EvConnectWithState{Cluster: cluster, StateFrom: from}); err != nil {
		return err
	}
	if _, ok := Find[Flusher](c.st); ok || c.View().Size() <= 1 {
		return nil // FLUSH fetched it while joining, or there is no one to ask
	}
	if err := c.GetState(ctx, from); err != nil {
		_ = c.Disconnect(context.WithoutCancel(ctx))
		return fmt.Errorf("strata: ConnectWithState: %w", err)
	}
	return nil
}

// connect joins cluster with req, an EvConnect or EvConnectWithState.
func (c *Channel) connect(ctx context.Context, cluster string, req Event) error {
	if cluster == "" || len(cluster) > MaxClusterName {
		return fmt.Errorf("strata: cluster name must be 1..%d bytes", MaxClusterName)
	}
	if c.stopping.Load() > 0 {
		if inCallback() {
			// The stop of the last connection waits for this callback.
			return fmt.Errorf("strata: connect to %s: %w", cluster, ErrWouldDeadlock)
		}
		c.stops.Wait()
	}
	c.mu.Lock()
	switch c.state {
	case chClosed:
		c.mu.Unlock()
		return ErrClosed
	case chConnected, chConnecting:
		c.mu.Unlock()
		return fmt.Errorf("strata: already connected to %s", c.st.Cluster())
	case chLeaving:
		// A failed connect is stopping the stack; it did since the check
		// above.
		c.mu.Unlock()
		c.stops.Wait()
		return c.connect(ctx, cluster, req)
	}
	c.state = chConnecting
	if c.everConn {
		c.newAddress()
	}
	c.everConn = true
	c.mu.Unlock()

	c.st.SetCluster(cluster)
	err := c.st.Start()
	if err == nil {
		err = c.st.DownEvent(ctx, req)
	}
	if err == nil && c.view.Load() == nil {
		self := c.Address()
		err = c.st.InstallView(ctx, NewView(self, 1, self))
	}
	c.mu.Lock()
	if err != nil {
		// The stop runs without c.mu, which the view path takes (upEvent):
		// a view installed meanwhile (the group's answer to the leave, say)
		// would otherwise wait for the stop that waits for it. Connect,
		// Disconnect and Close wait for it on c.stops.
		if c.state == chConnecting || c.state == chConnected {
			c.state = chLeaving
		}
		c.stopping.Add(1)
		c.stops.Add(1)
		c.mu.Unlock()
		defer c.stops.Done()
		defer c.stopping.Add(-1)
		if c.view.Load() != nil {
			// Joined, then failed (the state could not be fetched): leave
			// gracefully rather than be suspected as crashed.
			_ = c.st.DownEvent(context.WithoutCancel(ctx), EvDisconnect{})
		}
		c.connected.Store(false)
		c.st.Stop()
		c.cb.wait()
		c.view.Store(nil)
		c.mu.Lock()
		if c.state == chLeaving {
			c.state = chOpen
		}
		c.mu.Unlock()
		return fmt.Errorf("strata: connect to %s: %w", cluster, err)
	}
	defer c.mu.Unlock()
	if c.state == chConnecting {
		c.state = chConnected
		c.connected.Store(true)
	}
	// Otherwise the first ViewAccepted has already disconnected.
	return nil
}

// Send sends m down the stack: to m.Dest, or to the whole group if Dest is
// zero. It blocks as long as the stack makes it wait (flow control, flush)
// and returns ctx's error if ctx ends first. m must not be changed after.
func (c *Channel) Send(ctx context.Context, m *Message) error {
	defer c.cb.calls()()
	if !c.connected.Load() {
		if c.isClosed() {
			return ErrClosed
		}
		return ErrNotConnected
	}
	if m.Src.IsZero() {
		m.Src = c.Address()
	}
	if m.Dest.IsZero() && !m.Has(OOB) && c.wouldWaitForStateFlush() {
		return fmt.Errorf("strata: multicast from a state callback: %w: the group is flushed for the state transfer until the callback returns", ErrWouldDeadlock)
	}
	return c.st.Down(ctx, m)
}

// SendTo sends payload to dest (zero: the group).
func (c *Channel) SendTo(ctx context.Context, dest Address, payload []byte) error {
	return c.Send(ctx, NewMessage(dest, payload))
}

func (c *Channel) isClosed() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.state == chClosed
}

// Disconnect leaves the cluster gracefully and stops the stack; the channel
// can Connect again (with a new address). It returns once the stack's
// goroutines are gone, callbacks included; called from a callback, it
// returns once the member has left, and the stack stops when the callback
// returns.
func (c *Channel) Disconnect(ctx context.Context) error {
	defer c.cb.calls()()
	c.mu.Lock()
	if c.state != chConnected {
		c.mu.Unlock()
		if !inCallback() {
			c.stops.Wait()
		}
		return nil
	}
	c.state = chOpen
	c.mu.Unlock()
	err := c.st.DownEvent(ctx, EvDisconnect{})
	c.connected.Store(false)
	if inCallback() {
		c.stopping.Add(1)
		c.stops.Go(func() {
			defer c.stopping.Add(-1)
			c.stop()
		})
		return err
	}
	c.stop()
	return err
}

// stop stops the stack and waits for its goroutines and the callbacks
// queued before.
func (c *Channel) stop() {
	c.st.Stop()
	c.cb.wait()
	c.view.Store(nil)
}

// Close disconnects if needed and releases the stack. It returns when every
// goroutine of the stack has exited (receiver callbacks included); called
// from a callback, it returns after leaving the group, and the stack is
// released once the callback has returned.
func (c *Channel) Close() error {
	err := c.Disconnect(context.Background())
	c.mu.Lock()
	if c.state == chClosed {
		c.mu.Unlock()
		return nil
	}
	c.state = chClosed
	c.mu.Unlock()
	err = errors.Join(err, c.closeDiag())
	if inCallback() {
		c.stopping.Add(1)
		c.stops.Go(func() {
			defer c.stopping.Add(-1)
			c.cb.wait()
			if cerr := c.st.Close(); cerr != nil {
				c.st.Logger().Warn("close", "err", cerr)
			}
		})
		return err
	}
	c.stops.Wait()
	return errors.Join(err, c.st.Close())
}

// StartFlush blocks every member's multicasts and returns when all of them
// have delivered the same messages (FLUSH must be in the stack; without it
// StartFlush does nothing). Call StopFlush to unblock the group.
func (c *Channel) StartFlush(ctx context.Context) error {
	defer c.cb.calls()()
	if !c.connected.Load() {
		return ErrNotConnected
	}
	if c.wouldWaitForStateFlush() {
		return fmt.Errorf("strata: StartFlush from a state callback: %w: the state transfer's flush ends when the callback returns", ErrWouldDeadlock)
	}
	err := c.st.DownEvent(ctx, EvStartFlush{})
	return err
}

// StopFlush ends the flush this member started; it returns when every
// member has unblocked.
func (c *Channel) StopFlush(ctx context.Context) error {
	defer c.cb.calls()()
	if !c.connected.Load() {
		return ErrNotConnected
	}
	err := c.st.DownEvent(ctx, EvStopFlush{})
	return err
}

// GetState streams the application state from member from (zero: the
// coordinator) into the receiver's SetState, inside a flush when FLUSH is in
// the stack, so no member changes the state meanwhile. The receiver must
// implement StateHandler; the stack needs STATE_TRANSFER.
func (c *Channel) GetState(ctx context.Context, from Address) error {
	defer c.cb.calls()()
	if !c.connected.Load() {
		return ErrNotConnected
	}
	if _, ok := Find[StateTransferer](c.st); !ok {
		return fmt.Errorf("strata: GetState: %w: no state transfer layer (STATE_TRANSFER) in the stack", ErrNotSupported)
	}
	if err := c.StartFlush(ctx); err != nil {
		return fmt.Errorf("strata: GetState: %w", err)
	}
	err := c.st.DownEvent(ctx, EvGetState{From: from})
	// Unblock the group even if ctx has ended.
	stopErr := c.StopFlush(context.WithoutCancel(ctx))
	if err != nil {
		return fmt.Errorf("strata: GetState: %w", err)
	}
	return stopErr
}

// Stats returns every protocol's counters, bottom first, then the
// channel's own (CHANNEL: views queued and handed to the application,
// deliveries held behind a view), so a callback that never returns shows.
func (c *Channel) Stats() []ProtocolStats {
	return append(c.st.Stats(), ProtocolStats{Protocol: "CHANNEL", Stats: c.cb.stats()})
}

func (c *Channel) receive(m *Message) {
	// Counted in its epoch before the receipt says it has arrived: the
	// next view (which a flush may install as soon as it has the receipt)
	// then reaches the application after this message.
	e := c.cb.enterWith(m.receipt)
	defer c.cb.leave(e)
	if rc := m.receipt; rc != nil {
		rc.take()
	}
	r := c.receiver()
	switch {
	case r == nil:
	case !c.cb.gated(e):
		defer c.cb.inApp(e, m.receipt)()
		r.Receive(m)
	default:
		c.cb.hold(e, m.receipt, func() { r.Receive(m) })
	}
}

func (c *Channel) receiveBatch(bt *Batch) {
	var first *Receipt
	if len(bt.Msgs) > 0 {
		first = bt.Msgs[0].receipt
	}
	e := c.cb.enterWith(first)
	defer c.cb.leave(e)
	var last *Receipt
	for _, m := range bt.Msgs {
		if rc := m.receipt; rc != nil && rc != last {
			rc.take()
			last = rc
		}
	}
	r := c.receiver()
	if r == nil {
		return
	}
	if !c.cb.gated(e) {
		defer c.cb.inApp(e, first)()
		deliverBatch(r, bt)
		return
	}
	held := *bt // the lanes reuse bt once this returns
	held.Msgs = slices.Clone(bt.Msgs)
	c.cb.hold(e, first, func() { deliverBatch(r, &held) })
}

func deliverBatch(r Receiver, bt *Batch) {
	if br, ok := r.(BatchReceiver); ok {
		br.ReceiveBatch(bt)
		return
	}
	for _, m := range bt.Msgs {
		r.Receive(m)
	}
}

func (c *Channel) upEvent(ev Event) error {
	r := c.receiver()
	switch e := ev.(type) {
	case EvViewChange:
		v := e.View
		if v == nil {
			return errors.New("strata: VIEW_CHANGE without a view")
		}
		c.logView(c.view.Swap(v), v)
		// A member may send as soon as it has a view, also from the
		// ViewAccepted callback of its first view, which may run before
		// Connect returns.
		// A view that comes in while the member leaves (a Disconnect, a
		// failed connect) does not make it connected again.
		c.mu.Lock()
		if c.state == chConnecting {
			c.state = chConnected
		}
		live := c.state == chConnected
		c.mu.Unlock()
		if live {
			c.connected.Store(true)
		}
		if r != nil {
			c.cb.do(func() {
				defer c.cb.viewDone()
				r.ViewAccepted(v)
			}, true)
		}
	case EvProvideState, EvApplyState:
		sh, ok := r.(StateHandler)
		if !ok {
			return fmt.Errorf("strata: state transfer needs a receiver with GetState and SetState (StateHandler), have %T", r)
		}
		return c.stateCallback(sh, e)
	case EvBlock:
		if b, ok := r.(Blocker); ok {
			c.cb.do(b.Block, false)
		}
	case EvUnblock:
		if b, ok := r.(Blocker); ok {
			c.cb.do(b.Unblock, false)
		}
	}
	return nil
}

// stateCallback runs the application's GetState or SetState. With FLUSH in
// the stack, a state transfer runs inside a flush that ends only when the
// callback returns: while it runs, the channel refuses what would wait for
// that flush (StartFlush, GetState, a multicast) with ErrWouldDeadlock.
func (c *Channel) stateCallback(sh StateHandler, ev Event) error {
	c.inState.Add(1)
	defer c.inState.Add(-1)
	if p, ok := ev.(EvProvideState); ok {
		// The state covers every message that reached the channel before
		// the request (those the flush reconciled, some of them perhaps
		// still queued behind a view callback or on their way into
		// Receive): the requester's digest starts after them.
		c.cb.drain()
		return sh.GetState(p.W)
	}
	return sh.SetState(ev.(EvApplyState).R)
}

// wouldWaitForStateFlush reports whether the caller runs inside GetState or
// SetState while FLUSH holds the group for that state transfer (see
// stateCallback). It reads the stack only while a state callback runs.
func (c *Channel) wouldWaitForStateFlush() bool {
	if c.inState.Load() == 0 {
		return false
	}
	_, flush := Find[Flusher](c.st)
	return flush && onStack(stateFrame)
}

// Flusher is implemented by a layer that flushes the group (FLUSH): with
// one in the stack, a state transfer happens inside a flush round and a
// joiner's state comes with its first view.
type Flusher interface {
	Protocol
	FlushesGroup()
}

// StateTransferer is implemented by a layer that moves the application's
// state between members (STATE_TRANSFER); GetState and ConnectWithState
// need one.
type StateTransferer interface {
	Protocol
	TransfersState()
}

// ViewInstaller is implemented by the membership protocol; InstallView
// uses it, so injected views go through the same path as real ones.
type ViewInstaller interface {
	InstallView(ctx context.Context, v *View) error
}

// InstallView installs v on this member: through the membership protocol if
// the stack has one, otherwise by passing VIEW_CHANGE down from the top (every
// layer sees it) and then to the channel. Tests use it to inject views, as
// JGroups tests do.
func (s *Stack) InstallView(ctx context.Context, v *View) error {
	for _, p := range s.Protocols() {
		if vi, ok := p.(ViewInstaller); ok {
			return vi.InstallView(ctx, v)
		}
	}
	if err := s.DownEvent(ctx, EvViewChange{View: v}); err != nil {
		return err
	}
	_, err := s.top.UpEvent(EvViewChange{View: v})
	return err
}

// logView logs a view change once, at Info, with the attribute names every
// operator event uses (view, members; protocol is the layer's own).
func (c *Channel) logView(old, v *View) {
	if old != nil && old.ID == v.ID {
		return
	}
	joined, left := v.Diff(old)
	c.st.Logger().Info("view", "view", v.ID, "size", v.Size(), "coordinator", v.Coordinator(),
		"joined", joined, "left", left, "merge", v.IsMerge())
}
