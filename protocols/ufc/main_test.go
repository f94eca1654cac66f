package ufc_test

import (
	"testing"

	"github.com/strata-go/strata/stack/stacktest"
)

// TestMain fails the run early, with the stacks that hold it, when a
// synctest bubble stops moving (see stacktest.Main).
func TestMain(m *testing.M) { stacktest.Main(m) }
