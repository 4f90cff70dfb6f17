package sqlq

import "github.com/jackc/pgx/v5"

// ShortTx begins the transactions of consumer groups, all of which are
// short: if their instance stops answering in the middle of one (a
// frozen process), the server ends the session after IdleInTransaction,
// so the locks it holds (a group's position, rows being completed) do
// not stall the group's other instances, or other groups, for longer.
var ShortTx = pgx.TxOptions{BeginQuery: "BEGIN; SET LOCAL idle_in_transaction_session_timeout = '" + IdleInTransaction + "'"}

// IdleInTransaction is how long a consumer group's transaction may sit
// idle (see ShortTx).
const IdleInTransaction = "10s"
