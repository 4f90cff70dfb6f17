package router_test

import (
	"testing"

	"github.com/pgoutbox/pgoutbox/internal/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }
