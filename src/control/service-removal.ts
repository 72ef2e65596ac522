// What happens to the flows of a service a reload removes: they drain (the service stays in the
// snapshot with no real for new flows until its reals' last flows end), unless the new config
// makes that wrong. The daemon applies this rule and `dsrlb plan` predicts it.

import type { ServiceConfig } from '../config/types.js';

/**
 * Why the flows of `removed` cannot drain under the new `services`, or null when they drain: its
 * name went to a configured service (metrics and status go by name), or a configured port-0 service
 * of its VIP would lose the removed port's new flows to it (an exact port beats port 0).
 */
export function removalBlocker(services: readonly ServiceConfig[], removed: ServiceConfig): string | null {
  if (services.some((c) => c.name === removed.name)) return `its name "${removed.name}" is now another service's`;
  if (removed.port !== 0 && services.some((c) => c.port === 0 && c.protocol === removed.protocol && c.vip === removed.vip)) {
    return `the port-0 service of ${removed.vip} takes its port's new flows`;
  }
  return null;
}
