import assert from 'node:assert/strict';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { describe, it } from 'node:test';
import { cycles, importGraph } from '../../scripts/check-cycles.js';

describe('import cycles (scripts/check-cycles.ts, run by npm run lint)', () => {
  it('finds a value-level cycle and ignores type-only imports', () => {
    const dir = mkdtempSync(path.join(tmpdir(), 'gatehouse-cycles-'));
    try {
      const file = (name: string, text: string) => {
        writeFileSync(path.join(dir, name), text);
        return path.join(dir, name);
      };
      const a = file('a.ts', "import { b } from './b.js';\nexport const a = 1;\n");
      const b = file('b.ts', "import {\n  a,\n} from './a.js';\nexport const b = a;\n");
      const c = file(
        'c.ts',
        "import type { d } from './d.js';\nimport { type D } from './d.js';\nexport const c = 1;\n",
      );
      const d = file('d.ts', "import { c } from './c.js';\nexport type D = number;\nexport const d = c;\n");
      const found = cycles(importGraph([a, b, c, d]));
      assert.deepEqual(
        found.map((component) => component.map((f) => path.basename(f)).sort()),
        [['a.ts', 'b.ts']],
      );
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });

  it('src/ has none', () => {
    assert.deepEqual(cycles(importGraph()), []);
  });
});
