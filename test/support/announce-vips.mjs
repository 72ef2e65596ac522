// Run inside the LB's network namespace: announceVips (from dist/, as the daemon runs it) on
// interface argv[2] for the VIPs argv[4..], the second round argv[3] ms after the first. Its log
// lines (JSON) go to stdout; exits once the rounds are done.
const { announceVips } = await import(new URL('../../dist/control/vip-announcements.js', import.meta.url).href);
const { createLogger } = await import(new URL('../../dist/control/logger.js', import.meta.url).href);

const [ifname, repeatMs, ...vips] = process.argv.slice(2);
// The daemon's servers keep its event loop alive; here this does, until the second round (whose timer is unref'd).
const keepAlive = setInterval(() => undefined, 60_000);
await announceVips(ifname, vips, createLogger(), { repeatMs: Number(repeatMs), reason: 'test' }).done;
clearInterval(keepAlive);
