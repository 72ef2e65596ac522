// Types of config-shapes.js (plain JavaScript so the micro-benchmarks need no build step of their own).

export interface ConfigShape {
  services: number;
  realsPerService: number;
  comments?: boolean;
}

export declare function generateConfigText(shape: ConfigShape): string;
export declare const CONFIG_SHAPES: readonly (ConfigShape & { name: string })[];
