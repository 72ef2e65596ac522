// The dsrlb command line as users meet it: exit codes (0 ok, 1 user error, 2 refused), one line per
// problem on stderr, help. Runs the built CLI (npm test builds dist/ first); needs no privileges.

import { execFile } from 'node:child_process';
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { mkdtemp, readFile, symlink, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { promisify } from 'node:util';
import { describe, expect, it } from 'vitest';
import { commandNodeFlags, dsrlbArgv } from '../../src/cli/command-argv.js';
import { explainWhy } from '../../src/cli/main.js';
import type { Daemon } from '../../src/control/daemon.js';
import { startAdminServer } from '../../src/control/http-servers.js';

const CLI = resolve(import.meta.dirname, '../../bin/dsrlb.js');
const run = promisify(execFile);

async function dsrlb(args: string[]): Promise<{ code: number; stdout: string; stderr: string }> {
  try {
    const r = await run(process.execPath, [CLI, ...args]);
    return { code: 0, stdout: r.stdout, stderr: r.stderr };
  } catch (err) {
    const e = err as { code: number; stdout: string; stderr: string };
    return { code: e.code, stdout: e.stdout, stderr: e.stderr };
  }
}

describe('dsrlb CLI', () => {
  it('runs as a program through its own first line, with the node flags that line gives', async () => {
    // The installed /usr/local/bin/dsrlb and `npx dsrlb` run the file itself: `env -S` must split
    // the line, and node must still know every flag on it (an unknown V8 flag makes it exit 9).
    const first = (await readFile(CLI, 'utf8')).split('\n', 1)[0]!;
    expect(first).toMatch(/^#!\/usr\/bin\/env -S node( --[a-z-]+)+$/);
    expect(first).toContain('--no-memory-reducer');
    const r = await run(CLI, ['--version']);
    expect(r.stdout.trim()).toMatch(/^\d+\.\d+\.\d+/);
    // The demo, the tests and the bench start the daemon with node and the same flags.
    const root = resolve(import.meta.dirname, '../..');
    expect(commandNodeFlags(root)).toEqual(first.split(' ').slice(3));
    expect(dsrlbArgv(root)).toEqual([process.execPath, ...commandNodeFlags(root), CLI]);
    const viaArgv = dsrlbArgv(root);
    expect((await run(viaArgv[0]!, [...viaArgv.slice(1), '--version'])).stdout).toBe(r.stdout);
  });

  it('runs as `node dist/cli/main.js` too, the compiled file itself (before: nothing ran, exit 0)', async () => {
    const main = resolve(import.meta.dirname, '../../dist/cli/main.js');
    expect((await run(process.execPath, [main, '--version'])).stdout.trim()).toMatch(/^\d+\.\d+\.\d+/);
    const r = await run(process.execPath, [main, 'validate', '-c', '/nonexistent/dsrlb.yaml']).then(
      () => ({ code: 0, stderr: '' }),
      (e: { code: number; stderr: string }) => e,
    );
    expect(r.code).toBe(1);
    expect(r.stderr).toContain('/nonexistent/dsrlb.yaml');
  });

  it('validate: exit 0 for a good config, exit 1 with every problem as path: message', async () => {
    const dir = await mkdtemp(join(tmpdir(), 'dsrlb-cli-'));
    const good = join(dir, 'good.yaml');
    await writeFile(good, 'interface: eth0\nservices:\n  - vip: 10.0.0.100\n    port: 80\n    reals:\n      - address: 10.0.0.11\n');
    const ok = await dsrlb(['validate', '-c', good]);
    expect(ok.code).toBe(0);
    expect(ok.stdout).toContain('ok (1 service)');
    const bad = join(dir, 'bad.yaml');
    await writeFile(bad, 'interface: eth0\nservices:\n  - vip: 10.0.0.100\n    port: 80\n    schedular: maglev\n    reals:\n      - address: 10.0.1.300\n');
    const r = await dsrlb(['validate', '-c', bad]);
    expect(r.code).toBe(1);
    expect(r.stderr.trim().split('\n')).toEqual([
      'services[0].schedular: unknown key (did you mean "scheduler"?) (line 5, column 5)',
      'services[0].reals[0].address: "10.0.1.300" is not an IPv4 or IPv6 address (line 7, column 9)',
    ]);
    // The file without -c, as nginx -t and most checkers take it; one file only.
    const plain = await dsrlb(['validate', good]);
    expect([plain.code, plain.stdout]).toEqual([0, `${good}: ok (1 service)\n`]);
    expect((await dsrlb(['validate', bad])).code).toBe(1);
    const none = await dsrlb(['validate']);
    expect([none.code, none.stderr]).toEqual([1, 'dsrlb: Missing required argument: config (dsrlb validate -c FILE, or dsrlb validate FILE)\n']);
    const two = await dsrlb(['validate', '-c', good, bad]);
    expect([two.code, two.stderr]).toEqual([1, `dsrlb: two config files: -c ${good} and ${bad}; give one\n`]);
  });

  it('exits 1 with one line for an unknown command or a missing argument, 0 for --help', async () => {
    const unknown = await dsrlb(['frobnicate']);
    expect(unknown.code).toBe(1);
    expect(unknown.stderr.trim().split('\n')).toHaveLength(1);
    const missing = await dsrlb(['drain', 'web']);
    expect(missing.code).toBe(1);
    const help = await dsrlb(['--help']);
    expect(help.code).toBe(0);
    for (const cmd of ['run', 'validate', 'status', 'drain', 'weight', 'reload', 'explain', 'flows', 'plan', 'simulate', 'demo', 'decap', 'announce', 'withdraw']) {
      expect(help.stdout).toContain(`dsrlb ${cmd}`);
    }
  });

  it('flows refuses a --limit that is not a whole number before asking the daemon', async () => {
    const r = await dsrlb(['flows', '--limit', '1e3', '--admin', 'http://127.0.0.1:9']);
    expect([r.code, r.stderr.trim()]).toEqual([1, 'dsrlb: --limit "1e3" is not a whole number (0: every flow)']);
  });

  it('help shows the numeric options and WEIGHT without a [string] type (they are taken as typed, digits only)', async () => {
    const lineOf = (text: string, word: string): string => text.split('\n').find((l) => l.trimStart().startsWith(word)) ?? '';
    const flows = (await dsrlb(['flows', '--help'])).stdout;
    // --limit's text wraps: its type and default are on the line after it.
    const limit = flows.slice(flows.indexOf('--limit'), flows.indexOf('--json'));
    expect(limit).toContain('[default: 100]');
    expect(limit).not.toContain('[string]');
    expect(lineOf((await dsrlb(['weight', '--help'])).stdout, 'weight ')).not.toContain('[string]');
    const requests = lineOf((await dsrlb(['demo', '--help'])).stdout, '--requests');
    expect([requests.includes('[default: 60]'), requests.includes('[string]')]).toEqual([true, false]);
    const bare = await dsrlb(['demo', '--requests']);
    expect([bare.code, bare.stderr.trim()]).toEqual([1, 'dsrlb: Not enough arguments following: requests']);
  });

  it('refuses --no-X and --a.b forms (yargs made booleans and objects of options read as strings): exit 1, no TypeError', async () => {
    for (const args of [['decap', '--no-vip'], ['decap', '--vip', '10.0.0.1', '--no-interface'], ['decap', '--vip.x', '1'], ['decap', '--vip', '10.0.0.1', '--no-tun'], ['flows', '--limit.x', '3', '--admin', 'http://127.0.0.1:9']]) {
      const r = await dsrlb(args);
      expect([r.code, r.stderr.trim().split('\n').length], args.join(' ')).toEqual([1, 1]);
      expect(r.stderr, args.join(' ')).toMatch(/^dsrlb: (Unknown argument|Missing required argument)/);
    }
  });

  it('exits 2 when the daemon cannot be reached', async () => {
    const r = await dsrlb(['status', '--admin', 'http://127.0.0.1:9']);
    expect(r.code).toBe(2);
    expect(r.stderr).toMatch(/cannot reach the daemon at http:\/\/127\.0\.0\.1:9/);
  });

  it('a --token-file that cannot be read is a user error (exit 1) naming the file, before any request', async () => {
    // Port 9 is closed: a request would end in exit 2 ("cannot reach"), and a loopback daemon used to
    // be asked without a token, its 401 reported as "the daemon refused" (exit 2).
    for (const cmd of [['status'], ['drain', 'web', '10.0.0.11'], ['reload']]) {
      const r = await dsrlb([...cmd, '--token-file', 'nope', '--admin', 'http://127.0.0.1:9']);
      expect(r.code, cmd.join(' ')).toBe(1);
      expect(r.stderr.trim(), cmd.join(' ')).toBe('dsrlb: --token-file nope: cannot read token file: ENOENT');
    }
  });

  it('reload -c FILE reloads only when FILE is the daemon\'s own config file: another is refused (exit 1, both named, nothing reloaded)', async () => {
    const dir = await mkdtemp(join(tmpdir(), 'dsrlb-cli-'));
    const own = join(dir, 'dsrlb.yaml');
    await writeFile(own, 'interface: eth0\nservices: []\n');
    let reloads = 0;
    // The real admin API over a stand-in daemon that runs `own`.
    const fake = { config: { admin: { listen: { host: '127.0.0.1', port: 0 } } }, adminToken: null, configPath: own, reload: async (): Promise<object> => (reloads++, { ok: true, problems: [] }) };
    const server = await startAdminServer(fake as unknown as Daemon);
    const admin = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
    try {
      // A broken file whose admin section names this daemon, as in `validate -c bad1.yaml` (problems) then `reload -c bad1.yaml`.
      const bad = join(dir, 'bad1.yaml');
      await writeFile(bad, `admin: { listen: "${admin.slice('http://'.length)}" }\nservices:\n  - vip: 10.0.0.300\n    port: 80\n    reals: [ { address: 10.0.1.300 } ]\n`);
      const refused = await dsrlb(['reload', '-c', bad]);
      expect(refused.code).toBe(1);
      expect(refused.stdout).toBe('');
      expect(refused.stderr.trim()).toBe(
        `dsrlb: reload refused, nothing reloaded: ${bad} is not the daemon's config file ${own} (a reload reads the daemon's own file again, never another): ` +
          `check the new file with dsrlb plan -c ${bad}, then put it in place of ${own}`,
      );
      // Named relative to the current directory, or through --admin: the same.
      const relative = await run(process.execPath, [CLI, 'reload', '-c', 'bad1.yaml', '--admin', admin], { cwd: dir }).catch((e: { code: number }) => e);
      expect((relative as { code?: number }).code).toBe(1);
      expect(reloads).toBe(0);
      // The daemon's own file, by its name or a symlink to it: taken, and the answer says which file was read.
      const link = join(dir, 'current.yaml');
      await symlink(own, link);
      for (const c of [own, link]) {
        const taken = await dsrlb(['reload', '-c', c, '--admin', admin]);
        expect([taken.code, taken.stdout], c).toEqual([0, `reload taken (config ${own})\n`]);
      }
      // Without -c: whatever file the daemon runs (as SIGHUP), named.
      expect((await dsrlb(['reload', '--admin', admin])).stdout).toBe(`reload taken (config ${own})\n`);
      expect(reloads).toBe(3);
      // Taken with warnings (intent the file overrode, a state file it cannot write): each on stderr, exit 0.
      fake.reload = async () => (reloads++, { ok: true, problems: [], warnings: ['operator intent on web 10.0.1.2 (drain) dropped: the config file changed that real (now active, weight 5)'] });
      const warned = await dsrlb(['reload', '--admin', admin]);
      expect([warned.code, warned.stdout, warned.stderr]).toEqual([
        0,
        `reload taken (config ${own})\n`,
        'warning: operator intent on web 10.0.1.2 (drain) dropped: the config file changed that real (now active, weight 5)\n',
      ]);
    } finally {
      server.close();
    }
  });

  it('explain names the port of a port-0 service it answered for, and --json prints the daemon\'s answer', async () => {
    const answer = { service: 'allports', port: 8080, servicePort: 0, client: '10.0.0.1:4000', real: '10.0.1.13', reason: 'scheduler', scheduler: 'maglev', persistentClient: null, slot: 5, flowState: null, entryReal: null, generation: 3, realHealth: 'up', panic: false, dropping: false, droppingReason: null };
    const fake = { config: { admin: { listen: { host: '127.0.0.1', port: 0 } } }, adminToken: null, explain: async () => answer };
    const server = await startAdminServer(fake as unknown as Daemon);
    const admin = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
    try {
      const text = await dsrlb(['explain', 'tcp://10.0.0.100:8080', '10.0.0.1:4000', '--admin', admin]);
      expect([text.code, text.stdout]).toEqual([0, 'allports port 8080 10.0.0.1:4000 -> 10.0.1.13 (scheduler: maglev slot 5)\n']);
      const json = await dsrlb(['explain', 'tcp://10.0.0.100:8080', '10.0.0.1:4000', '--admin', admin, '--json']);
      expect([json.code, JSON.parse(json.stdout)]).toEqual([0, answer]);
      answer.servicePort = 80;
      answer.port = 80;
      expect((await dsrlb(['explain', 'web', '10.0.0.1:4000', '--admin', admin])).stdout).toBe('allports 10.0.0.1:4000 -> 10.0.1.13 (scheduler: maglev slot 5)\n');
    } finally {
      server.close();
    }
  });

  it('simulate prints the example trace and refuses an invalid scenario with path: message lines', async () => {
    const ok = await dsrlb(['simulate', resolve(import.meta.dirname, '../../examples/simulate-wlc-vs-maglev.yaml')]);
    expect(ok.code).toBe(0);
    expect(JSON.parse(ok.stdout)).toHaveProperty('summary');
    const dir = await mkdtemp(join(tmpdir(), 'dsrlb-cli-'));
    const bad = join(dir, 'bad.yaml');
    await writeFile(bad, 'config: { interface: eth0, services: [ { vip: 10.0.0.1, port: 80, reals: [ { address: 10.0.0.2 } ] } ] }\nevents:\n  - at: 2s\n    flow: { id: a, client: "192.0.2.1:1000", duration: 0s }\n');
    const r = await dsrlb(['simulate', bad]);
    expect(r.code).toBe(1);
    expect(r.stderr).toMatch(/events\[0\]\.flow\.duration: /);
  });

  it('takes WEIGHT as typed: "", 0x10, 1e3 or -1 are user errors, checked before any request', async () => {
    // Port 9 is closed: a request would end in exit 2, so exit 1 proves the check came first.
    for (const w of ['', '0x10', '1e3', '-1', '65536', 'abc']) {
      const r = await dsrlb(['weight', 'web', '10.0.0.11', w, '--admin', 'http://127.0.0.1:9']);
      expect(r.code, `weight ${JSON.stringify(w)}`).toBe(1);
      expect(r.stderr.trim()).toBe(`dsrlb: weight ${JSON.stringify(w)} is not a whole number 0..65535`);
    }
  });

  it('refuses a malformed explain CLIENT as a user error (exit 1) before asking any daemon', async () => {
    for (const [client, message] of [
      ['1.2.3.4', 'client "1.2.3.4" is not IP:PORT (or [IPv6]:PORT)'],
      ['[10.0.0.1]:80', 'client "[10.0.0.1]:80": brackets are for IPv6 addresses only'],
      ['10.0.0.1:0', 'client "10.0.0.1:0": port 0 is not 1..65535'],
      ['host:80', 'client "host:80": "host" is not an IP address'],
    ]) {
      const r = await dsrlb(['explain', 'web', client!, '--admin', 'http://127.0.0.1:9']);
      expect(r.code, client).toBe(1);
      expect(r.stderr.trim()).toBe(`dsrlb: ${message}`);
    }
  });

  it('explain of a port whose closing connection is still in the table names both reals: the SYN\'s and the one the closing packets go to', () => {
    const base = { service: 'web', reason: 'scheduler', scheduler: 'maglev', slot: 43050, flowState: 'fin', panic: false, dropping: false, realHealth: 'up' };
    expect(explainWhy({ ...base, real: '10.77.0.12', entryReal: '10.77.0.11' })).toBe(
      "scheduler: maglev slot 43050, replacing a fin entry; until a new SYN the closing connection's packets go to 10.77.0.11",
    );
    // The same real either way: nothing more to say.
    expect(explainWhy({ ...base, real: '10.77.0.11', entryReal: '10.77.0.11' })).toBe('scheduler: maglev slot 43050, replacing a fin entry');
    // An older daemon sends no entryReal.
    expect(explainWhy({ ...base, real: '10.77.0.12' })).toBe('scheduler: maglev slot 43050, replacing a fin entry');
  });

  it('explain of a connection the port-0 service placed before the port got a service of its own says whose it is', () => {
    const base = { service: 'alt', reason: 'flow-table', scheduler: 'maglev', slot: null, flowState: 'established', panic: false, dropping: false, real: '10.77.0.11', realHealth: 'up' };
    expect(explainWhy({ ...base, realService: 'any' })).toBe('flow-table hit, established, a connection of service any (it keeps its real; new connections go to alt)');
    expect(explainWhy({ ...base, realService: null })).toBe('flow-table hit, established');
  });

  it('explain of a service with client persistence names the client prefix the pick was hashed by', () => {
    const base = { service: 'web', reason: 'scheduler', scheduler: 'maglev', slot: 812, flowState: null, panic: false, dropping: false, real: '10.77.0.12', realHealth: 'up' };
    expect(explainWhy({ ...base, persistentClient: '192.0.2.0/24' })).toBe('scheduler: maglev slot 812 by client 192.0.2.0/24 (persistence)');
    expect(explainWhy({ ...base, persistentClient: null })).toBe('scheduler: maglev slot 812');
    expect(explainWhy({ ...base, ops: true })).toBe('scheduler: maglev slot 812, one-packet scheduling: every datagram placed alone, no flow entry');
  });

  it('explain of a flow kept on a down real says why it is still there', () => {
    const base = { service: 'web', reason: 'flow-table', flowState: 'established', panic: false, dropping: false, real: '10.77.0.11', realHealth: 'down' };
    expect(explainWhy(base)).toBe('flow-table hit, established; 10.77.0.11 is down (its flows stay: onRealDown keep)');
    expect(explainWhy({ ...base, panic: true })).toBe('flow-table hit, established; failOpen: no real is up, every wanted real takes new flows; 10.77.0.11 is down');
  });

  it('refuses a demo request count that is not a whole number 1..10000 before building anything', async () => {
    for (const n of ['abc', '0', '1.5', '-3', '20000']) {
      const r = await dsrlb(['demo', '--requests', n]);
      expect(r.code, n).toBe(1);
      expect(r.stderr.trim()).toBe(`dsrlb: --requests ${JSON.stringify(n)} is not a whole number 1..10000`);
    }
  });

  it('refuses repeated, empty and malformed options as user errors (exit 1, one line)', async () => {
    const cases: [string[], RegExp][] = [
      [['validate', '-c', 'a.yaml', '-c', 'b.yaml'], /--config is given 2 times; give it once/],
      [['validate', '-c'], /Not enough arguments following: c|--config needs a value/],
      [['status', '--admin', 'a', '--admin', 'b'], /--admin is given 2 times/],
      [['status', '--admin', 'not-a-url'], /--admin "not-a-url" is not an http:\/\/ or https:\/\/ URL/],
      [['plan', '-c', 'x.yaml', '--against'], /Not enough arguments following: against|--against needs a value/],
    ];
    for (const [args, message] of cases) {
      const r = await dsrlb(args);
      expect(r.code, args.join(' ')).toBe(1);
      expect(r.stderr.trim().split('\n'), args.join(' ')).toHaveLength(1);
      expect(r.stderr, args.join(' ')).toMatch(message);
    }
  });

  it('names an unknown command as a command and suggests the near one', async () => {
    const r = await dsrlb(['validat', '-c', 'x.yaml']);
    expect(r.code).toBe(1);
    expect(r.stderr.trim()).toBe('dsrlb: unknown command "validat". Did you mean validate?');
    const far = await dsrlb(['frobnicate']);
    expect(far.stderr.trim()).toBe('dsrlb: Unknown command: frobnicate');
  });

  it('calls an extra word after a command an unexpected argument, not an unknown command', async () => {
    const r = await dsrlb(['status', 'web', 'extra']);
    expect(r.code).toBe(1);
    expect(r.stderr.trim()).toBe('dsrlb: unexpected argument "extra" for status (dsrlb status --help)');
    const w = await dsrlb(['weight', 'web', '10.0.0.1', '5', '6']);
    expect(w.stderr.trim()).toBe('dsrlb: unexpected argument "6" for weight (dsrlb weight --help)');
  });

  it('names the option given without a command', async () => {
    const r = await dsrlb(['--bogus']);
    expect(r.code).toBe(1);
    expect(r.stderr.trim()).toBe('dsrlb: --bogus without a command: name a command first (dsrlb --help lists them)');
    const none = await dsrlb([]);
    expect(none.stderr.trim()).toBe('dsrlb: name a command (dsrlb --help lists them)');
  });

  it('says in one line when --admin points at something that is not dsrlb', async () => {
    const servers: Server[] = [];
    const serve = async (status: number, body: string): Promise<string> => {
      const srv = createServer((_, res) => res.writeHead(status, { 'content-type': 'text/html' }).end(body));
      servers.push(srv);
      await new Promise<void>((r) => srv.listen(0, '127.0.0.1', r));
      return `http://127.0.0.1:${(srv.address() as AddressInfo).port}`;
    };
    try {
      const html = await serve(404, '<html>\n<head><title>404 Not Found</title></head>\n<body>\n<h1>Not Found</h1>\n</body>\n</html>\n');
      const notFound = await dsrlb(['status', '--admin', html]);
      expect(notFound.code).toBe(2);
      expect(notFound.stderr.trim()).toBe(`dsrlb: ${html} is not a dsrlb admin API: HTTP 404 404 Not Found Not Found`);
      const hello = await serve(200, 'hello');
      const ok200 = await dsrlb(['status', '--json', '--admin', hello]);
      expect(ok200.code).toBe(2);
      expect(ok200.stdout).toBe('');
      expect(ok200.stderr.trim()).toBe(`dsrlb: ${hello} is not a dsrlb admin API: HTTP 200 hello`);
    } finally {
      for (const srv of servers) srv.close();
    }
  });

  it('ends quietly when the reader of its output leaves (simulate | head)', async () => {
    const scenario = resolve(import.meta.dirname, '../../examples/simulate-wlc-vs-maglev.yaml');
    const r = await run('bash', ['-c', `set -o pipefail; "${process.execPath}" "${CLI}" simulate "${scenario}" 2>/tmp/dsrlb-epipe-$$.err | head -c 100 >/dev/null; echo "rc=$? stderr=$(wc -c </tmp/dsrlb-epipe-$$.err)"; rm -f /tmp/dsrlb-epipe-$$.err`]);
    expect(r.stdout.trim()).toBe('rc=0 stderr=0');
  });

  it('plan against the daemon reports every problem of a broken candidate before it asks the daemon', async () => {
    const dir = await mkdtemp(join(tmpdir(), 'dsrlb-cli-'));
    const bad = join(dir, 'candidate.yaml');
    await writeFile(bad, 'interface: eth0\nservices:\n  - vip: 10.0.0.100\n    port: 80\n    schedular: maglev\n    reals:\n      - address: 10.0.1.300\n');
    const r = await dsrlb(['plan', '-c', bad, '--admin', 'http://127.0.0.1:9']);
    expect(r.code).toBe(1);
    expect(r.stderr.trim().split('\n')).toEqual([
      `${bad}: services[0].schedular: unknown key (did you mean "scheduler"?) (line 5, column 5)`,
      `${bad}: services[0].reals[0].address: "10.0.1.300" is not an IPv4 or IPv6 address (line 7, column 9)`,
    ]);
  });
});
