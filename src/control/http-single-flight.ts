// One run of an expensive answer shared by every request that asks while it is in flight (a
// /metrics render, /plan-input's collection of the loops' flows). Nothing is kept once the run has
// settled: a request after it starts a new run, so a shared answer is never older than the run in
// flight when the request arrived.

/** `run` wrapped so that calls while a run is in flight get that run's promise (its answer or its error). */
export function singleFlight<T>(run: () => Promise<T>): () => Promise<T> {
  let inFlight: Promise<T> | null = null;
  return () => {
    if (inFlight !== null) return inFlight;
    let current: Promise<T>;
    try {
      current = run();
    } catch (err) {
      return Promise.reject(err);
    }
    inFlight = current;
    // Registered before any caller awaits `current`, so it runs first when the run settles: a
    // caller resumed by the answer that asks again starts a new run.
    const settled = (): void => {
      if (inFlight === current) inFlight = null;
    };
    current.then(settled, settled);
    return current;
  };
}
