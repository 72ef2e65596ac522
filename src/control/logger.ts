// JSON log lines on stdout, one object per line: {"ts":..., "level":..., "msg":..., ...fields}.

export type LogLevel = 'debug' | 'info' | 'warn' | 'error';

export interface Logger {
  debug(msg: string, fields?: Record<string, unknown>): void;
  info(msg: string, fields?: Record<string, unknown>): void;
  warn(msg: string, fields?: Record<string, unknown>): void;
  error(msg: string, fields?: Record<string, unknown>): void;
}

export function createLogger(write: (line: string) => void = (l) => process.stdout.write(l + '\n'), minLevel: LogLevel = 'info'): Logger {
  const order: Record<LogLevel, number> = { debug: 0, info: 1, warn: 2, error: 3 };
  const emit = (level: LogLevel, msg: string, fields?: Record<string, unknown>): void => {
    if (order[level] < order[minLevel]) return;
    write(JSON.stringify({ ts: new Date().toISOString(), level, msg, ...fields }));
  };
  return {
    debug: (m, f) => emit('debug', m, f),
    info: (m, f) => emit('info', m, f),
    warn: (m, f) => emit('warn', m, f),
    error: (m, f) => emit('error', m, f),
  };
}
