package stack

import "sync"

// Serial runs the functions given to it one at a time, in the order given,
// on a goroutine of a layer (started when there is work, gone when there is
// none). A layer hands it its calls into the application: one that waits
// holds up only the calls queued behind it, never the protocol that made
// them or a lock that protocol holds. The zero value is ready to use.
type Serial struct {
	mu      sync.Mutex
	queue   []func()
	running bool
}

// Do queues f to run after every function queued before it, on a
// goroutine owned by b (see Base.Go). It reports false, and f does not
// run, once b has stopped.
func (s *Serial) Do(b *Base, f func()) bool {
	s.mu.Lock()
	s.queue = append(s.queue, f)
	if s.running {
		s.mu.Unlock()
		return true
	}
	s.running = true
	s.mu.Unlock()
	if b.Go(func(<-chan struct{}) { s.run() }) {
		return true
	}
	s.mu.Lock()
	s.running, s.queue = false, nil
	s.mu.Unlock()
	return false
}

func (s *Serial) run() {
	for {
		s.mu.Lock()
		if len(s.queue) == 0 {
			s.running = false
			s.mu.Unlock()
			return
		}
		f := s.queue[0]
		s.queue[0] = nil
		s.queue = s.queue[1:]
		s.mu.Unlock()
		f()
	}
}
