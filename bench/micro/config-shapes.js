// Large configs in the format of examples/dsrlb.yaml, for timing config loads: a few services with
// many reals each, or many services with a few reals each. Deterministic: the same shape gives the
// same text, so runs compare.

/**
 * YAML text of a valid config with `services` services of `realsPerService` reals each. Every
 * service has an http health check and a name; VIPs are distinct IPv4 addresses in 203.0.0.0/16
 * (or 2001:db8:ffff::/48 for every fourth service), reals are 10.S.H.L, and every tenth real
 * carries a weight, a state or a forwarding override as an operator's file would.
 * @param {{ services: number, realsPerService: number, comments?: boolean }} shape
 * @returns {string}
 */
export function generateConfigText({ services, realsPerService, comments = true }) {
  const c = (text) => (comments ? `   # ${text}` : '');
  const lines = [
    '# generated for bench/micro/config-load.js',
    `interface: eth0${c('VIP traffic arrives here')}`,
    'io: afpacket',
    'ring: v3',
    'hashSeed: 0',
    'workers: 2',
    'flowTable:',
    `  capacity: 1000000${c('entries')}`,
    '  tcpTimeouts: { syn: 60s, established: 900s, fin: 120s }',
    '  udpTimeout: 300s',
    'tunnel:',
    '  sourceV4: 192.0.2.5',
    '  sourceV6: 2001:db8::5',
    'metrics: { listen: 127.0.0.1:9742 }',
    'admin:',
    '  listen: 127.0.0.1:9743',
    '  tokenFile: /etc/dsrlb/admin.token',
    'stateFile: /var/lib/dsrlb/dsrlb.state.json',
    'announce:',
    '  enabled: false',
    '  withdrawDelay: 300ms',
    'services:',
  ];
  for (let s = 0; s < services; s++) {
    const v6 = realsPerService <= 16 && s % 4 === 3;
    const vip = v6 ? `2001:db8:ffff::${(s + 1).toString(16)}` : `203.0.${Math.floor(s / 250)}.${(s % 250) + 1}`;
    lines.push(
      `  - name: svc-${s}${c(`service ${s}`)}`,
      `    vip: ${vip}`,
      `    port: ${s % 2 === 0 ? 80 : 443}`,
      '    protocol: tcp',
      `    scheduler: ${s % 3 === 0 ? 'rendezvous' : 'maglev'}`,
      `    forwarding: ${v6 ? 'ipip' : 'l2'}`,
      '    whenAllDown: failOpen',
      '    healthCheck:',
      '      type: http',
      '      path: /healthz',
      '      expectStatus: [200, 204]',
      '      interval: 2s',
      '      timeout: 1s',
      '      rise: 2',
      '      fall: 3',
      '    reals:',
    );
    for (let r = 0; r < realsPerService; r++) {
      // 10.S.H.L with S the service (mod 250) and H.L the real: unique within a service.
      const address = v6 ? `2001:db8:${(s + 1).toString(16)}::${(r + 1).toString(16)}` : `10.${s % 250}.${Math.floor(r / 250)}.${(r % 250) + 1}`;
      lines.push(`      - address: ${address}`);
      if (r % 10 === 1) lines.push('        weight: 50');
      if (r % 10 === 2) lines.push(`        state: drain${c('leaving')}`);
      if (r % 10 === 3 && !v6) lines.push('        forwarding: ipip');
      if (r % 10 === 5) lines.push('        weight: 100');
    }
  }
  lines.push('');
  return lines.join('\n');
}

/** The two shapes the scale review named: 8 services x 1,000 reals, 2,000 services x 4 reals. */
export const CONFIG_SHAPES = [
  { name: '8x1000', services: 8, realsPerService: 1000 },
  { name: '2000x4', services: 2000, realsPerService: 4 },
];
