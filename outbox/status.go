package outbox

// ConnectionStatus says how a client's connections of its own stand: the
// LISTEN connection that wakes its consumers, and the session that proves
// the process alive (see Client.LiveInstance). It is read from memory.
type ConnectionStatus struct {
	// WakeUps is the LISTEN connection's state: WakeUpsPolling (PollOnly),
	// WakeUpsIdle (no consumer runs), WakeUpsListening,
	// WakeUpsReconnecting, or WakeUpsDeaf (it listens, but the client's
	// own notifications do not reach it: a transaction pooler?).
	// Consumers poll within their PollInterval whatever it is.
	WakeUps string `json:"wake_ups"`
	// WakeUpsError is why the last LISTEN connection ended, if one did.
	WakeUpsError string `json:"wake_ups_error,omitempty"`
	// ProofOfLife is the state of the session that proves the process
	// alive: ProofOff (PollOnly), ProofIdle (no consumer group instance
	// runs), ProofHeld, ProofNoSession (the connection is not a session
	// of its own: a crashed process's work comes back with its lease), or
	// ProofReconnecting.
	ProofOfLife string `json:"proof_of_life"`
	// ProofOfLifeError is why the last session ended or could not be
	// made, if one did.
	ProofOfLifeError string `json:"proof_of_life_error,omitempty"`
}

// The values of ConnectionStatus.WakeUps.
const (
	WakeUpsPolling      = "polling"
	WakeUpsIdle         = "idle"
	WakeUpsListening    = "listening"
	WakeUpsReconnecting = "reconnecting"
	WakeUpsDeaf         = "deaf"
)

// The values of ConnectionStatus.ProofOfLife.
const (
	ProofOff          = "off"
	ProofIdle         = "idle"
	ProofHeld         = "held"
	ProofNoSession    = "no session of its own"
	ProofReconnecting = "reconnecting"
)

// Connections returns how the client's own connections stand now.
func (c *Client) Connections() ConnectionStatus {
	var s ConnectionStatus
	if c.listen == nil {
		s.WakeUps, s.ProofOfLife = WakeUpsPolling, ProofOff
		return s
	}
	c.wake.mu.Lock()
	listener := c.wake.listener
	c.wake.mu.Unlock()
	switch {
	case listener == nil:
		s.WakeUps = WakeUpsIdle
	default:
		st := listener.State()
		s.WakeUpsError = st.LastError
		switch {
		case !st.Listening:
			s.WakeUps = WakeUpsReconnecting
		case st.Deaf:
			s.WakeUps = WakeUpsDeaf
		default:
			s.WakeUps = WakeUpsListening
		}
	}
	l := c.live
	l.mu.Lock()
	defer l.mu.Unlock()
	s.ProofOfLifeError = l.lastErr
	switch {
	case l.run == nil:
		s.ProofOfLife = ProofIdle
	case l.held:
		s.ProofOfLife = ProofHeld
	case l.noSession:
		s.ProofOfLife = ProofNoSession
	default:
		s.ProofOfLife = ProofReconnecting
	}
	return s
}
