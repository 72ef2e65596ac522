import { describe, expect, it } from 'vitest';
import { parseProcArp } from '../../src/control/neighbors.js';

const ARP = `IP address       HW type     Flags       HW address            Mask     Device
10.77.0.11       0x1         0x2         02:aa:00:00:00:11     *        eth0
10.77.0.12       0x1         0x0         00:00:00:00:00:00     *        eth0
10.77.0.13       0x1         0x6         02:AA:00:00:00:13     *        eth0
10.77.0.14       0x1         0x2         02:aa:00:00:00:14     *        eth1
`;

describe('parseProcArp', () => {
  it('keeps complete and permanent entries of the interface, drops incomplete ones and other interfaces', () => {
    expect(parseProcArp(ARP, 'eth0')).toEqual([
      { dst: '10.77.0.11', lladdr: '02:aa:00:00:00:11', state: ['REACHABLE'] },
      { dst: '10.77.0.13', lladdr: '02:AA:00:00:00:13', state: ['PERMANENT'] },
    ]);
    expect(parseProcArp(ARP, 'eth1').map((e) => e.dst)).toEqual(['10.77.0.14']);
    expect(parseProcArp('IP address HW type Flags HW address Mask Device\n', 'eth0')).toEqual([]);
  });
});
