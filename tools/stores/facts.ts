// Facts about models that only the worker can read (parameter counts and weight sizes from the
// safetensors headers, digests), fetched once per worker life and cached.
import type { PlanShapeFacts } from "../../policies/estimate.js";
import type { Runtime } from "../../runtime/types.js";

export interface ModelFact {
  id: string;
  parameters: number | null;
  weight_bytes: number | null;
  weight_digest: string | null;
  available: boolean;
  problem: string | null;
  /**
   * The worker's memory pre-flight for a load and a first request, bytes by dtype (its memory.py;
   * absent: the worker did not say, or another engine serves the model).
   */
  memory_bytes?: Record<string, number>;
  /**
   * Every forward shape of the shape plan a load holds (the worker's shapes.py), which a load in
   * mode "compile" warms one graph each; absent: the worker keeps no plan for the model (another
   * engine serves it) or did not say.
   */
  plan_shapes?: PlanShapeFacts[];
  /** Text generation: whether the model has a chat template (absent: the worker did not say). */
  chat_template?: boolean;
}

/** What the worker knows of each catalog model (not the estimator's ModelFacts, a plain record). */
export interface ModelFactStore {
  all(): Promise<Map<string, ModelFact>>;
  get(id: string): Promise<ModelFact | undefined>;
  invalidate(): void;
}

export class WorkerModelFacts implements ModelFactStore {
  private cache: Promise<Map<string, ModelFact>> | null = null;
  constructor(private readonly runtime: Runtime) {
    runtime.on("ready", () => this.invalidate());
  }

  all(): Promise<Map<string, ModelFact>> {
    if (!this.cache) {
      const p = this.runtime
        .call("describe", {})
        .then(({ result }) => new Map(result.models.map((m) => [m.id, m])));
      // A failed describe is not cached: the next call asks again.
      p.catch(() => {
        if (this.cache === p) this.cache = null;
      });
      this.cache = p;
    }
    return this.cache;
  }

  async get(id: string): Promise<ModelFact | undefined> {
    return (await this.all()).get(id);
  }

  invalidate(): void {
    this.cache = null;
  }
}
