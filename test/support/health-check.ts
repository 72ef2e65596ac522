// A complete health-check config for the health unit tests: a tcp check with the config's
// defaults (interval 2 s, timeout 1 s, rise 2, fall 3), port 0, then the test's overrides.
import type { HealthCheckConfig } from '../../src/config/types.js';
import { healthCheckDefaults } from '../../src/config/validate.js';

export function healthCheck(over: Partial<HealthCheckConfig> = {}): HealthCheckConfig {
  return { type: 'tcp', ...healthCheckDefaults(0), ...over };
}
