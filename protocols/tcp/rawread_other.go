//go:build !unix

package tcp

// canReadRaw: elsewhere a frameReader reads through net.Conn.Read and
// keeps its chunk while it waits.
const canReadRaw = false

func readRaw(uintptr, []byte) (int, error) { panic("tcp: readRaw") }

func wouldBlock(error) bool { return false }
