// The `dsrlb` command line (yargs). Exit codes: 0 success, 1 user error (bad flag, bad config,
// unknown service), 2 the daemon or the system refused. Errors: one line per problem on stderr.

import { realpath } from 'node:fs/promises';
import { resolve } from 'node:path';
import { pathToFileURL } from 'node:url';
import yargs, { type Argv } from 'yargs';
import { hideBin } from 'yargs/helpers';
import { formatProblems, parseClientEndpoint } from '../config/validate.js';
import { loadConfigFile, parseConfigText } from '../config/load.js';
import { adminRequest, CliError, DEFAULT_CONFIG_PATH, resolveAdminTarget } from './admin-client.js';
import { formatStatus } from './status-table.js';
import { formatFlows } from './flows-table.js';


/** A string option given exactly once with a value: yargs makes an array of a repeated one. */
function once(flag: string) {
  return (value: unknown): string => {
    if (Array.isArray(value)) throw new CliError(`${flag} is given ${value.length} times; give it once`, 1);
    if (typeof value !== 'string' || value === '') throw new CliError(`${flag} needs a value`, 1);
    return value;
  };
}

/** --admin: an http(s) URL, checked here so that a typo is a user error, not an unreachable daemon. */
function adminUrl(value: unknown): string {
  const text = once('--admin')(value);
  let url: URL | null = null;
  try {
    url = new URL(text);
  } catch {
    // reported below
  }
  if (url === null || (url.protocol !== 'http:' && url.protocol !== 'https:')) throw new CliError(`--admin ${JSON.stringify(text)} is not an http:// or https:// URL`, 1);
  return text;
}

const SERVICE_HELP = 'service name, or tcp://VIP:PORT, udp://VIP:PORT, tcp://[V6]:PORT';
const REAL_HELP = "the real's address";

function adminOptions<T>(y: Argv<T>) {
  return y
    .option('config', { alias: 'c', type: 'string', requiresArg: true, coerce: once('--config'), describe: `config file naming the admin API (default ${DEFAULT_CONFIG_PATH})` })
    .option('admin', { type: 'string', requiresArg: true, coerce: adminUrl, describe: 'admin API URL (overrides the config), e.g. http://127.0.0.1:9743' })
    .option('token-file', { type: 'string', requiresArg: true, coerce: once('--token-file'), describe: 'file holding the admin bearer token' });
}

/** -c FILE of the commands that need a file (run, validate, plan). */
function configFileOption<T>(y: Argv<T>, describe: string) {
  return y.option('config', { alias: 'c', type: 'string', demandOption: true, requiresArg: true, coerce: once('--config'), describe });
}

/** `{configRealPath}` of a file that resolves here (symlinks followed), else nothing. */
async function realpathOf(path: string): Promise<{ configRealPath?: string }> {
  return realpath(path).then(
    (configRealPath) => ({ configRealPath }),
    () => ({}),
  );
}

function print(text: string): void {
  process.stdout.write(text.endsWith('\n') ? text : text + '\n');
}

async function intent(argv: { config?: string; admin?: string; tokenFile?: string; service: string; real: string }, verb: string): Promise<number> {
  const target = await resolveAdminTarget(argv);
  const path = `/services/${encodeURIComponent(argv.service)}/reals/${encodeURIComponent(argv.real)}/${verb}`;
  const { data } = await adminRequest(target, 'POST', path);
  print(intentLine(data, argv.service, argv.real));
  return 0;
}

/** An intent verb's answer: the service and real as the daemon names them, not as typed (`TCP://10.0.0.1:080` is `web`). */
function intentLine(data: Record<string, unknown>, service: string, real: string): string {
  const after = data.after as { state: string; weight: number };
  const before = data.before as { state: string; weight: number } | undefined;
  const same = before !== undefined && before.state === after.state && before.weight === after.weight;
  const unchanged = typeof data.note === 'string' ? ` (${data.note})` : same ? ' (already so: nothing changed)' : '';
  return `${String(data.service ?? service)} ${String(data.real ?? real)}: ${after.state}, weight ${after.weight}${unchanged}`;
}

async function plan(a: { config: string; against?: string; json: boolean; admin?: string; tokenFile?: string }): Promise<number> {
  const { runPlanCommand, groupLiveFlows } = await import('../sim/plan.js');
  const { decodeLiveFlows } = await import('../sim/live-flows-wire.js');
  // Without --against: the running daemon's config, intent and health in force and its live flows,
  // fetched only once the candidate is valid (a broken one is reported in full, daemon or not).
  const live = async () => {
    const target = await resolveAdminTarget({ config: a.config, admin: a.admin, tokenFile: a.tokenFile });
    const { data } = await adminRequest(target, 'GET', '/plan-input').catch((err: CliError) => {
      throw new CliError(`${err.message} (or compare two files with --against FILE)`, err.exitCode);
    });
    const current = parseConfigText(String(data.configText), { sourcePath: String(data.configPath) });
    if (!current.ok) throw new CliError('the running daemon returned a config that does not validate', 2);
    let flows: ReturnType<typeof decodeLiveFlows>;
    try {
      flows = decodeLiveFlows(data.flows as import('../sim/live-flows-wire.js').LiveFlowsWire);
    } catch (err) {
      throw new CliError(`the running daemon's live flows: ${(err as Error).message}`, 2);
    }
    if (flows.cut) process.stderr.write(`dsrlb plan: the daemon sent ${flows.realIndex.length} of its live flows (its limit): the live-flow figures count those only\n`);
    const liveFlows = groupLiveFlows(flows.keys, flows.realIndex, flows.realIndex.length, (i) => flows.reals[i] ?? null);
    // The intent and health in force (admin overrides, probes); a daemon that does not send them leaves plan on config intent.
    const liveReals = Array.isArray(data.reals) ? (data.reals as import('../sim/plan.js').LiveReal[]) : undefined;
    return { current: current.config, liveFlows, liveReals };
  };
  const out = await runPlanCommand(a.against ? { config: a.config, against: a.against, json: a.json } : { config: a.config, live, json: a.json });
  if (out.stdout) process.stdout.write(out.stdout);
  if (out.stderr) process.stderr.write(out.stderr);
  return out.exitCode;
}

/**
 * Why explain's real: "flow-table hit, established", or the scheduler and its slot, e.g.
 * "scheduler: maglev slot 1234" (with the finished entry a new SYN replaces, if there is one).
 */
export function explainWhy(d: Record<string, unknown>): string {
  const state = typeof d.flowState === 'string' ? d.flowState : null;
  // Why a new flow has no real, or gets one that is down: the service's state (as status shows it).
  const notes: string[] = [];
  if (d.panic === true) notes.push('failOpen: no real is up, every wanted real takes new flows');
  // A flow-table hit on a down real outside a panic: the service keeps a down real's flows.
  const kept = d.reason === 'flow-table' && d.panic !== true ? ' (its flows stay: onRealDown keep)' : '';
  if (d.real !== null && d.realHealth === 'down') notes.push(`${String(d.real)} is down${kept}`);
  const also = notes.length > 0 ? `; ${notes.join('; ')}` : '';
  // A connection the VIP's port-0 service placed before this port had a service of its own.
  const other = typeof d.realService === 'string' ? `, a connection of service ${d.realService} (it keeps its real; new connections go to ${String(d.service)})` : '';
  if (d.reason === 'flow-table') return `flow-table hit${state ? `, ${state}` : ''}${other}${also}`;
  if (d.real === null && d.dropping === true) return `new flows dropped: ${String(d.droppingReason)}`;
  const slot = typeof d.slot === 'number' ? ` slot ${d.slot}` : '';
  const article = state !== null && /^[aeiou]/.test(state) ? 'an' : 'a';
  const closing = typeof d.entryReal === 'string' && d.entryReal !== d.real ? `; until a new SYN the closing connection's packets go to ${d.entryReal}` : '';
  const persistent = typeof d.persistentClient === 'string' ? ` by client ${d.persistentClient} (persistence)` : '';
  const ops = d.ops === true ? ', one-packet scheduling: every datagram placed alone, no flow entry' : '';
  return `${String(d.reason)}: ${String(d.scheduler)}${slot}${persistent}${ops}${state ? `, replacing ${article} ${state} entry` : ''}${closing}${also}`;
}

/** WEIGHT as typed: decimal digits only, 0..65535 (no "", 0x10 or 1e3). */
function parseWeight(text: string): number {
  if (!/^\d{1,5}$/.test(text) || Number(text) > 65535) throw new CliError(`weight ${JSON.stringify(text)} is not a whole number 0..65535`, 1);
  return Number(text);
}

function parseRequestCount(text: string): number {
  if (!/^\d{1,5}$/.test(text) || Number(text) < 1 || Number(text) > 10_000) throw new CliError(`--requests ${JSON.stringify(text)} is not a whole number 1..10000`, 1);
  return Number(text);
}

const NO_COMMAND = 'name a command (dsrlb --help lists them)';

export async function main(args: string[]): Promise<number> {
  // `dsrlb simulate X | head`: a reader that leaves early is no error. A daemon (run, decap; set by
  // their handlers, wherever the command word is) whose log reader went away (journald restarted,
  // a closed pipe) goes on and loses the later log lines: exiting there, without undoing its host
  // changes, took a real server out of service (exit 0 is no failure to Restart=on-failure).
  let daemon = false;
  process.stdout.on('error', (err: NodeJS.ErrnoException) => {
    if (daemon) return;
    if (err.code !== 'EPIPE') throw err;
    process.exit(0);
  });
  let exitCode = 0;
  const setExit = (p: Promise<number>): Promise<void> => p.then((c) => void (exitCode = c));
  const parser = yargs(args)
    .scriptName('dsrlb')
    // Numbers stay as typed, for the commands' own strict parsing (decimal digits only: no 0x10,
    // 1e3 or " 5"); so the numeric options declare no type, and help shows none rather than [string].
    // No --no-X and no --a.b: they handed a boolean or an object to options read as strings
    // (`decap --no-vip` ended in a TypeError); strict mode now calls them unknown.
    .parserConfiguration({ 'parse-numbers': false, 'parse-positional-numbers': false, 'boolean-negation': false, 'dot-notation': false })
    .strict()
    .strictCommands()
    .recommendCommands()
    .demandCommand(1, NO_COMMAND)
    .command(
      'run',
      'run the daemon in the foreground',
      (y) => configFileOption(y, 'config file'),
      (a) => ((daemon = true), setExit(import('./run-command.js').then((m) => m.runDaemon(a.config)))),
    )
    .command(
      'validate [file]',
      'check a config file without touching the network',
      // -c FILE as the contract has it; FILE alone as well (nginx -t -c, but haproxy -c -f: both habits).
      (y) =>
        y
          .positional('file', { type: 'string', describe: 'the config file, as -c FILE' })
          .option('config', { alias: 'c', type: 'string', requiresArg: true, coerce: once('--config'), describe: 'config file' })
          .check((a) => {
            if (a.file === undefined && a.config === undefined) throw new CliError('Missing required argument: config (dsrlb validate -c FILE, or dsrlb validate FILE)', 1);
            if (a.file !== undefined && a.config !== undefined && a.file !== a.config) throw new CliError(`two config files: -c ${a.config} and ${a.file}; give one`, 1);
            return true;
          }),
      (a) => {
        const file = (a.config ?? a.file)!;
        return setExit(
          loadConfigFile(file).then((r) => {
            if (r.ok) {
              print(`${file}: ok (${r.config.services.length} service${r.config.services.length === 1 ? '' : 's'})`);
              return 0;
            }
            process.stderr.write(formatProblems(r.problems) + '\n');
            return 1;
          }),
        );
      },
    )
    .command(
      'status [service]',
      'services and reals, as ipvsadm -Ln shows them (one service, as ipvsadm -Ln -t VIP:PORT)',
      (y) =>
        adminOptions(y)
          .positional('service', { type: 'string', describe: `only this service: ${SERVICE_HELP}` })
          .option('json', { type: 'boolean', default: false, describe: 'print the status as JSON' }),
      (a) =>
        setExit(
          (async () => {
            const query = a.service === undefined ? '' : `?${new URLSearchParams({ service: a.service })}`;
            const { data } = await adminRequest(await resolveAdminTarget(a), 'GET', `/status${query}`);
            print(a.json ? JSON.stringify(data, null, 2) : formatStatus(data as never));
            return 0;
          })(),
        ),
    )
    .command(
      'flows [service]',
      'the connection table, as ipvsadm -Lnc shows it: each flow, its real, state and expiry',
      (y) =>
        adminOptions(y)
          .positional('service', { type: 'string', describe: `only this service's flows (${SERVICE_HELP})` })
          .option('real', { type: 'string', requiresArg: true, describe: 'only the flows on this real (an address; with SERVICE as REAL)' })
          .option('client', { type: 'string', requiresArg: true, describe: 'only the flows from this client: an address, or IP:PORT ([V6]:PORT) for one connection' })
          .option('limit', { requiresArg: true, default: '100', defaultDescription: '100', describe: 'list at most this many (0: all); the count of every match is printed' })
          .option('json', { type: 'boolean', default: false, describe: 'print the flows as JSON' }),
      (a) =>
        setExit(
          (async () => {
            if (!/^\d{1,8}$/.test(a.limit)) throw new CliError(`--limit ${JSON.stringify(a.limit)} is not a whole number (0: every flow)`, 1);
            const q = new URLSearchParams({ limit: a.limit });
            if (a.service !== undefined) q.set('service', a.service);
            if (a.real !== undefined) q.set('real', a.real);
            if (a.client !== undefined) q.set('client', a.client);
            const { data } = await adminRequest(await resolveAdminTarget(a), 'GET', `/flows?${q.toString()}`);
            print(a.json ? JSON.stringify(data, null, 2) : formatFlows(data as never, Number(a.limit) !== 0 && Number(a.limit) < 1_000_000));
            return 0;
          })(),
        ),
    )
    .command(
      'reload',
      "reload the daemon's own config file (as SIGHUP); prints which file and whether it was taken",
      (y) =>
        // adminOptions' -c, described for what reload does with it.
        adminOptions(y).option('config', {
          type: 'string',
          requiresArg: true,
          coerce: once('--config'),
          describe: `the daemon's config file (its admin section finds the API; default ${DEFAULT_CONFIG_PATH}): refused, nothing reloaded, if the daemon runs another`,
        }),
      (a) =>
        setExit(
          (async () => {
            // A reload reads the daemon's own config file. `-c FILE` names the file the operator
            // means: the daemon refuses (409, exit 1) when it is not its own, instead of
            // reloading its own and saying "taken". Sent as typed (absolute) and as resolved here.
            const body = a.config === undefined ? undefined : { configPath: resolve(a.config), ...(await realpathOf(a.config)) };
            const { data } = await adminRequest(await resolveAdminTarget(a), 'POST', '/reload', body);
            const problems = (data.problems as string[]) ?? [];
            const file = typeof data.configPath === 'string' ? ` (config ${data.configPath})` : '';
            if (data.result === 'taken') {
              print(`reload taken${file}`);
              // Taken, but worth knowing (intent the config file overrode, a state file it cannot write); absent from older daemons.
              const warnings = Array.isArray(data.warnings) ? (data.warnings as string[]) : [];
              if (warnings.length > 0) process.stderr.write(warnings.map((w) => `warning: ${w}\n`).join(''));
              return 0;
            }
            process.stderr.write([`reload refused${file}:`, ...problems].join('\n') + '\n');
            // The config (a user error) or the host (the token file, an address change) refused.
            return data.refusedBy === 'system' ? 2 : 1;
          })(),
        ),
    );
  for (const verb of ['drain', 'undrain', 'disable', 'enable'] as const) {
    parser.command(
      `${verb} <service> <real>`,
      { drain: 'no new flows for a real, existing flows stay', undrain: 'let a drained real take new flows again', disable: 'no flows at all for a real', enable: 'let a disabled real take flows again' }[verb],
      (y) => adminOptions(y).positional('service', { type: 'string', demandOption: true, describe: SERVICE_HELP }).positional('real', { type: 'string', demandOption: true, describe: REAL_HELP }),
      (a) => setExit(intent(a as never, verb)),
    );
  }
  for (const verb of ['announce', 'withdraw'] as const) {
    parser.command(
      `${verb} <service>`,
      verb === 'announce' ? "announce the service's VIP through BIRD again (undo withdraw)" : "withdraw the service's VIP from BIRD (the router stops sending it here)",
      (y) => adminOptions(y).positional('service', { type: 'string', demandOption: true, describe: SERVICE_HELP }),
      (a) =>
        setExit(
          (async () => {
            const { data } = await adminRequest(await resolveAdminTarget(a), 'POST', `/services/${encodeURIComponent(a.service)}/${verb}`);
            const shared = Array.isArray(data.sharedWith) ? (data.sharedWith as string[]) : [];
            const still = Array.isArray(data.stillWithdrawnBy) ? (data.stillWithdrawnBy as string[]) : [];
            // The route is the VIP's: say which other services go (or stay) with it.
            const note = !data.announce && shared.length > 0
              ? ` (VIP ${String(data.vip)} withdrawn, with ${shared.join(', ')})`
              : data.announce && still.length > 0
                ? ` (VIP ${String(data.vip)} stays withdrawn while ${still.join(', ')} is)`
                : '';
            if (data.unchanged === true) {
              print(`${String(data.service)}: ${data.announce ? 'not withdrawn' : 'withdrawn already'} (no change)${note}`);
              return 0;
            }
            print(`${String(data.service)}: ${data.announce ? 'announced' : 'withdrawn'}${note}`);
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
          .positional('service', { type: 'string', demandOption: true, describe: SERVICE_HELP })
          .positional('real', { type: 'string', demandOption: true, describe: REAL_HELP })
          // Left as typed and checked here: as a number yargs turns "" (an unset shell variable) into 0.
          .positional('weight', { demandOption: true, describe: '0..65535 (0: no new flows, as IPVS)' }),
      (a) =>
        setExit(
          (async () => {
            const weight = parseWeight(String(a.weight));
            const path = `/services/${encodeURIComponent(a.service)}/reals/${encodeURIComponent(a.real)}/weight`;
            const { data } = await adminRequest(await resolveAdminTarget(a), 'PUT', path, { weight });
            print(intentLine(data, a.service, a.real));
            return 0;
          })(),
        ),
    )
    .command(
      'explain <service> <client>',
      'which real a flow from CLIENT_IP:PORT gets, and why',
      (y) =>
        adminOptions(y)
          .positional('service', { type: 'string', demandOption: true, describe: `${SERVICE_HELP} (for a service of every port, tcp://VIP:PORT names the port asked about)` })
          .positional('client', { type: 'string', demandOption: true, describe: 'CLIENT_IP:PORT, [V6]:PORT for IPv6' })
          .option('json', { type: 'boolean', default: false, describe: 'print the daemon\'s answer as JSON' }),
      (a) =>
        setExit(
          (async () => {
            // A malformed CLIENT is the user's to fix (exit 1), whether or not a daemon runs.
            const endpoint = parseClientEndpoint(a.client);
            if ('error' in endpoint) throw new CliError(endpoint.error, 1);
            const q = `/explain?service=${encodeURIComponent(a.service)}&client=${encodeURIComponent(a.client)}`;
            const { data } = await adminRequest(await resolveAdminTarget(a), 'GET', q);
            if (a.json) {
              print(JSON.stringify(data, null, 2));
              return 0;
            }
            // A port-0 service answers for the port asked about: name it.
            const port = data.servicePort === 0 && typeof data.port === 'number' ? ` port ${data.port}` : '';
            print(`${data.service}${port} ${data.client} -> ${data.real ?? 'no real'} (${explainWhy(data)})`);
            return 0;
          })(),
        ),
    )
    .command(
      'plan',
      'what a config change would do: hash space moved, live flows that change real, risky edits',
      (y) =>
        configFileOption(y, 'the candidate config')
          .option('against', { type: 'string', requiresArg: true, coerce: once('--against'), describe: 'compare with this config file instead of the running daemon' })
          .option('json', { type: 'boolean', default: false, describe: 'print the plan as JSON' })
          .option('admin', { type: 'string', requiresArg: true, coerce: adminUrl, describe: 'admin API URL of the running daemon (default: from the candidate config)' })
          .option('token-file', { type: 'string', requiresArg: true, coerce: once('--token-file'), describe: 'file holding the admin bearer token' }),
      (a) => setExit(plan(a)),
    )
    .command(
      'simulate <scenario>',
      'replay a scenario of flows and real changes through the real scheduler and flow table (no privileges, no network)',
      (y) =>
        y
          .positional('scenario', { type: 'string', demandOption: true, describe: 'scenario file (YAML or JSON)' })
          .epilog('A scenario: description, config (inline or a file), events: [{ at: 1s, ACTION: {...} }] with ACTION one of flow, addReal, removeReal, weight, intent, health (README, "Simulation and change preview"; examples/simulate-operations.yaml uses them all).'),
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
          .option('tun', { type: 'string', describe: 'TUN device name (default dsrlb-decap0)' })
          .option('allow-source', { type: 'string', array: true, describe: 'take tunnel packets only from these outer sources (the LBs), CIDR[,CIDR..]; default: any, as a kernel tunnel' }),
      (a) => ((daemon = true), setExit(import('../decap/decap-command.js').then((m) => m.runDecap({ interface: a.interface, vips: a.vip.flatMap((v) => v.split(',')), tunName: a.tun, allowSources: a['allow-source'] })))),
    )
    .command(
      'demo',
      'build a lab of network namespaces, run dsrlb in it, send traffic and show where it went',
      (y) =>
        y
          .option('down', { type: 'boolean', default: false, describe: 'remove the demo lab' })
          .option('requests', { requiresArg: true, default: '60', coerce: parseRequestCount, defaultDescription: '60', describe: 'HTTP requests the demo client sends (1..10000)' }),
      (a) => setExit(import('./demo.js').then((m) => (a.down ? m.demoDown() : m.demoUp({ requests: a.requests })))),
    )
    .fail((msg, err) => {
      // yargs wraps what a coerce function throws in its own YError: still a bad argument.
      if (err) throw err instanceof CliError || err.name !== 'YError' ? err : new CliError(err.message, 1);
      // `dsrlb --bogus` or `dsrlb -c x.yaml`: yargs asks for a command before it looks at the options; name the option.
      const option = msg === NO_COMMAND ? args.find((a) => a.startsWith('-')) : undefined;
      if (option !== undefined) throw new CliError(`${option} without a command: name a command first (dsrlb --help lists them)`, 1);
      // `dsrlb status extra`: strictCommands calls any extra word an unknown command; it is an extra argument.
      const extra = /^Unknown command: (.*)$/.exec(msg)?.[1];
      if (extra !== undefined && args[0] !== extra) throw new CliError(`unexpected argument ${JSON.stringify(extra)} for ${args[0]} (dsrlb ${args[0]} --help)`, 1);
      throw new CliError(msg.startsWith('Did you mean') ? `unknown command ${JSON.stringify(args[0])}. ${msg}` : msg, 1);
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

// Run as a script (`node dist/cli/main.js decap ...`, as a unit file may say): as bin/dsrlb.js
// runs it, less its --no-memory-reducer. It only exported main(), so such a command did nothing
// and exited 0: a real that never decapsulated, with nothing said.
if (process.argv[1] !== undefined && import.meta.url === pathToFileURL(await realpath(process.argv[1]).catch(() => process.argv[1]!)).href) {
  process.exitCode = await main(hideBin(process.argv));
}
