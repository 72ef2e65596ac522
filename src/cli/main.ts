// The `dsrlb` command line (yargs). Exit codes: 0 success, 1 user error (bad flag, bad config,
// unknown service), 2 the daemon or the system refused. Errors: one line per problem on stderr.

import yargs, { type Argv } from 'yargs';
import { hideBin } from 'yargs/helpers';
import { formatProblems } from '../config/validate.js';
import { loadConfigFile, parseConfigText } from '../config/load.js';
import { adminRequest, CliError, resolveAdminTarget } from './admin-client.js';
import { formatStatus } from './status-table.js';

const DEFAULT_CONFIG = '/etc/dsrlb/dsrlb.yaml';

function adminOptions<T>(y: Argv<T>) {
  return y
    .option('config', { alias: 'c', type: 'string', describe: 'config file naming the admin API', default: DEFAULT_CONFIG })
    .option('admin', { type: 'string', describe: 'admin API URL (overrides the config), e.g. http://127.0.0.1:9743' })
    .option('token-file', { type: 'string', describe: 'file holding the admin bearer token' });
}

function print(text: string): void {
  process.stdout.write(text.endsWith('\n') ? text : text + '\n');
}

async function intent(argv: { config?: string; admin?: string; tokenFile?: string; service: string; real: string }, verb: string): Promise<number> {
  const target = await resolveAdminTarget(argv);
  const path = `/services/${encodeURIComponent(argv.service)}/reals/${encodeURIComponent(argv.real)}/${verb}`;
  const { data } = await adminRequest(target, 'POST', path);
  const after = data.after as { state: string; weight: number };
  print(`${argv.service} ${argv.real}: ${after.state}, weight ${after.weight}`);
  return 0;
}

async function plan(a: { config: string; against?: string; json: boolean; admin?: string; tokenFile?: string }): Promise<number> {
  const { runPlanCommand, groupLiveFlows } = await import('../sim/plan.js');
  let out;
  if (a.against) {
    out = await runPlanCommand({ config: a.config, against: a.against, json: a.json });
  } else {
    // Against the running daemon: its config in force and its live flows.
    const target = await resolveAdminTarget({ config: a.config, admin: a.admin, tokenFile: a.tokenFile });
    const { data } = await adminRequest(target, 'GET', '/plan-input').catch((err: CliError) => {
      throw new CliError(`${err.message} (or compare two files with --against FILE)`, err.exitCode);
    });
    const current = parseConfigText(String(data.configText), { sourcePath: String(data.configPath) });
    if (!current.ok) throw new CliError('the running daemon returned a config that does not validate', 2);
    const flows = data.flows as { keys: number[]; reals: { identity: string; address: string }[] };
    const ids = Int32Array.from(flows.reals.keys());
    const liveFlows = groupLiveFlows(Uint32Array.from(flows.keys), ids, flows.reals.length, (i) => flows.reals[i] ?? null);
    out = await runPlanCommand({ config: a.config, current: current.config, liveFlows, json: a.json });
  }
  if (out.stdout) process.stdout.write(out.stdout);
  if (out.stderr) process.stderr.write(out.stderr);
  return out.exitCode;
}

export async function main(args: string[]): Promise<number> {
  let exitCode = 0;
  const setExit = (p: Promise<number>): Promise<void> => p.then((c) => void (exitCode = c));
  const parser = yargs(args)
    .scriptName('dsrlb')
    .strict()
    .demandCommand(1, 'name a command (dsrlb --help lists them)')
    .command(
      'run',
      'run the daemon in the foreground',
      (y) => y.option('config', { alias: 'c', type: 'string', demandOption: true, describe: 'config file' }),
      (a) => setExit(import('./run-command.js').then((m) => m.runDaemon(a.config))),
    )
    .command(
      'validate',
      'check a config file without touching the network',
      (y) => y.option('config', { alias: 'c', type: 'string', demandOption: true, describe: 'config file' }),
      (a) =>
        setExit(
          loadConfigFile(a.config).then((r) => {
            if (r.ok) {
              print(`${a.config}: ok (${r.config.services.length} services)`);
              return 0;
            }
            process.stderr.write(formatProblems(r.problems) + '\n');
            return 1;
          }),
        ),
    )
    .command(
      'status',
      'services and reals, as ipvsadm -Ln shows them',
      (y) => adminOptions(y).option('json', { type: 'boolean', default: false }),
      (a) =>
        setExit(
          (async () => {
            const { data } = await adminRequest(await resolveAdminTarget(a), 'GET', '/status');
            print(a.json ? JSON.stringify(data, null, 2) : formatStatus(data as never));
            return 0;
          })(),
        ),
    )
    .command(
      'reload',
      'reload the daemon config (as SIGHUP); prints whether it was taken',
      (y) => adminOptions(y),
      (a) =>
        setExit(
          (async () => {
            const { data } = await adminRequest(await resolveAdminTarget(a), 'POST', '/reload');
            const problems = (data.problems as string[]) ?? [];
            if (data.result === 'taken') {
              print('reload taken');
              return 0;
            }
            process.stderr.write(['reload refused:', ...problems].join('\n') + '\n');
            return 1;
          })(),
        ),
    );
  for (const verb of ['drain', 'undrain', 'disable', 'enable'] as const) {
    parser.command(
      `${verb} <service> <real>`,
      { drain: 'no new flows for a real, existing flows stay', undrain: 'let a drained real take new flows again', disable: 'no flows at all for a real', enable: 'let a disabled real take flows again' }[verb],
      (y) => adminOptions(y).positional('service', { type: 'string', demandOption: true }).positional('real', { type: 'string', demandOption: true }),
      (a) => setExit(intent(a as never, verb)),
    );
  }
  for (const verb of ['announce', 'withdraw'] as const) {
    parser.command(
      `${verb} <service>`,
      verb === 'announce' ? "announce the service's VIP through BIRD again (undo withdraw)" : "withdraw the service's VIP from BIRD (the router stops sending it here)",
      (y) => adminOptions(y).positional('service', { type: 'string', demandOption: true }),
      (a) =>
        setExit(
          (async () => {
            const { data } = await adminRequest(await resolveAdminTarget(a), 'POST', `/services/${encodeURIComponent(a.service)}/${verb}`);
            print(`${String(data.service)}: ${data.announce ? 'announced' : 'withdrawn'}`);
            return 0;
          })(),
        ),
    );
  }
  parser
    .command(
      'weight <service> <real> <weight>',
      'change the weight of a real at run time',
      (y) =>
        adminOptions(y)
          .positional('service', { type: 'string', demandOption: true })
          .positional('real', { type: 'string', demandOption: true })
          .positional('weight', { type: 'number', demandOption: true }),
      (a) =>
        setExit(
          (async () => {
            if (!Number.isInteger(a.weight) || a.weight < 0 || a.weight > 65535) throw new CliError(`weight ${a.weight} is not an integer 0..65535`, 1);
            const path = `/services/${encodeURIComponent(a.service)}/reals/${encodeURIComponent(a.real)}/weight`;
            const { data } = await adminRequest(await resolveAdminTarget(a), 'PUT', path, { weight: a.weight });
            const after = data.after as { state: string; weight: number };
            print(`${a.service} ${a.real}: ${after.state}, weight ${after.weight}`);
            return 0;
          })(),
        ),
    )
    .command(
      'explain <service> <client>',
      'which real a flow from CLIENT_IP:PORT gets, and why',
      (y) => adminOptions(y).positional('service', { type: 'string', demandOption: true }).positional('client', { type: 'string', demandOption: true }),
      (a) =>
        setExit(
          (async () => {
            const q = `/explain?service=${encodeURIComponent(a.service)}&client=${encodeURIComponent(a.client)}`;
            const { data } = await adminRequest(await resolveAdminTarget(a), 'GET', q);
            print(`${data.service} ${data.client} -> ${data.real ?? 'no real'} (${data.reason})`);
            return 0;
          })(),
        ),
    )
    .command(
      'plan',
      'what a config change would do: hash space moved, live flows that change real, risky edits',
      (y) =>
        y
          .option('config', { alias: 'c', type: 'string', demandOption: true, describe: 'the candidate config' })
          .option('against', { type: 'string', describe: 'compare with this config file instead of the running daemon' })
          .option('json', { type: 'boolean', default: false })
          .option('admin', { type: 'string', describe: 'admin API URL of the running daemon (default: from the candidate config)' })
          .option('token-file', { type: 'string', describe: 'file holding the admin bearer token' }),
      (a) => setExit(plan(a)),
    )
    .command(
      'simulate <scenario>',
      'replay a scenario of flows and real changes through the real scheduler and flow table (no privileges, no network)',
      (y) => y.positional('scenario', { type: 'string', demandOption: true, describe: 'scenario file (YAML or JSON)' }),
      (a) =>
        setExit(
          import('../sim/simulate.js').then((m) => {
            const out = m.runSimulateCommand({ scenario: a.scenario });
            if (out.stdout) process.stdout.write(out.stdout);
            if (out.stderr) process.stderr.write(out.stderr);
            return out.exitCode;
          }),
        ),
    )
    .command(
      'decap',
      'user-space IPIP / IPv6-in-IPv6 decapsulation on a real server whose kernel has no ipip/ip6_tunnel',
      (y) =>
        y
          .option('interface', { type: 'string', describe: 'receive tunnel packets on this interface only' })
          .option('vip', { type: 'string', array: true, demandOption: true, describe: 'VIP(s) inner packets must be addressed to (comma-separated or repeated)' })
          .option('tun', { type: 'string', describe: 'TUN device name (default dsrlb-decap0)' }),
      (a) => setExit(import('../decap/decap-command.js').then((m) => m.runDecap({ interface: a.interface, vips: a.vip.flatMap((v) => v.split(',')), tunName: a.tun }))),
    )
    .command(
      'demo',
      'build a lab of network namespaces, run dsrlb in it, send traffic and show where it went',
      (y) => y.option('down', { type: 'boolean', default: false, describe: 'remove the demo lab' }).option('requests', { type: 'number', default: 60 }),
      (a) => setExit(import('./demo.js').then((m) => (a.down ? m.demoDown() : m.demoUp({ requests: a.requests })))),
    )
    .fail((msg, err) => {
      if (err) throw err;
      throw new CliError(msg, 1);
    })
    .help()
    .alias('h', 'help');
  try {
    await parser.parseAsync();
  } catch (err) {
    if (err instanceof CliError) {
      process.stderr.write(`dsrlb: ${err.message}\n`);
      return err.exitCode;
    }
    process.stderr.write(`dsrlb: ${(err as Error).message}\n`);
    return 2;
  }
  return exitCode;
}

export { hideBin };
