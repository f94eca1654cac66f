package window

import (
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/require"

	"github.com/strata-go/strata/stack"
)

// TestWindowOfASilentSenderIsSmall: a member of a large group holds a
// window for every sender, and most never send; such a window stays at 96
// bytes (the free rows, the remover's slice and the pacer come with the
// first traffic), where it was 192.
func TestWindowOfASilentSenderIsSmall(t *testing.T) {
	require.LessOrEqual(t, unsafe.Sizeof(Window{}), uintptr(96))
	w := New(7, true)
	require.False(t, w.Gap())
	require.Empty(t, w.Missing(7, 10))
	require.Equal(t, 0, w.Purge(7))
	require.Nil(t, w.cold, "nothing came: no cold part")
	w.Add(9, &stack.Message{}, false, 0)
	w.Due(time.Now(), time.Millisecond, time.Second)
	require.NotNil(t, w.cold, "the pacer lives in the cold part")
}
