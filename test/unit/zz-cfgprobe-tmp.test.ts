import { it } from 'vitest';
import { parseConfigText, formatProblems } from '/work/main/src/config/validate.js';
it('p', () => {
  for (const t of ['interface: eth0\nservices:\n  - vip: [1.2.3.4\n', 'a: b: c\n', 'x: *nope\n', '---\na: 1\n---\nb: 2\n', 'interface: eth0\nservices:\n- vip: ::1\n  port: 80\n  reals: []\n', 'interface:\nservices:\n  -\n', "interface: eth0\nservices:\n  - {vip: 1.2.3.4, port: 80, reals: [], healthCheck: {type: tcp, port: 0}, protocol: TCP}\nadmin: {listen: '[::]:9742'}\n"]) {
    const r = parseConfigText(t); console.log(JSON.stringify(t), '\n', r.ok ? 'OK' : formatProblems(r.problems));
  }
});
