// Package transport holds what the network transports (UDP, TCP) share
// beyond stack.TransportBase: the sender-side bundler with its bounded
// queue and buffer pool, and the logical-to-physical address cache. A
// transport adds only its sockets and framing.
package transport
