package engine

import (
	"testing"

	"github.com/pgoutbox/pgoutbox/internal/testsupport/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }
