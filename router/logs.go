package router

import "log/slog"

// levelOf is the log level of a warning's severity.
func levelOf(sev Severity) slog.Level {
	if sev == SeverityWarn {
		return slog.LevelWarn
	}
	return slog.LevelError
}
