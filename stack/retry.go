package stack

import "time"

// Retry is a resend schedule with time passed in, for a layer that sends
// something again until it is answered: every Every, and no longer than
// Limit after the start. It has no clock or goroutine: the layer sleeps
// until Due and asks At what to do, so the schedule is tested without time
// passing.
type Retry struct {
	next, until time.Time
	every       time.Duration
}

// NewRetry starts a schedule at now: resends every every, until limit has
// passed.
func NewRetry(now time.Time, every, limit time.Duration) Retry {
	return Retry{next: now.Add(every), until: now.Add(limit), every: every}
}

// Due returns when At next has something to say.
func (r *Retry) Due() time.Time {
	if r.until.Before(r.next) {
		return r.until
	}
	return r.next
}

// At reports, at now, whether the limit has passed (expired), or else
// whether a resend is due (and schedules the next one).
func (r *Retry) At(now time.Time) (resend, expired bool) {
	if !now.Before(r.until) {
		return false, true
	}
	if now.Before(r.next) {
		return false, false
	}
	for !r.next.After(now) {
		r.next = r.next.Add(r.every)
	}
	return true, false
}
