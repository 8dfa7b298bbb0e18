package stripesim

import (
	"time"
)

// ClockNow returns the simulator's current time: the base clock (Config.Now) plus every advance
// made with ClockAdvance since the last Reset. Objects' "created" fields and the idempotency
// retention window use this clock.
func (s *Server) ClockNow() time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.nowLocked()
}

// ClockAdvance moves the simulator's clock forward by d and returns the new time. It returns
// an error wrapping ErrInvalid if d is negative: the clock never goes backwards.
func (s *Server) ClockAdvance(d time.Duration) (time.Time, error) {
	if d < 0 {
		return time.Time{}, errorf(ErrInvalid, "clock can only advance, got %s", d)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.clockOffset += d
	now := s.nowLocked()
	s.logger.Info("clock advanced", "by", d.String(), "now", now.UTC().Format(time.RFC3339))
	return now, nil
}

// nowLocked returns the simulator's clock. s.mu must be held.
func (s *Server) nowLocked() time.Time {
	return s.cfg.Now().Add(s.clockOffset)
}
