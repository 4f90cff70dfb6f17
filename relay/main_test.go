package relay_test

import (
	"os"
	"testing"

	"github.com/pgoutbox/pgoutbox/internal/testsupport/pgtest"
)

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) != "" {
		childMain()
	}
	pgtest.Main(m)
}
